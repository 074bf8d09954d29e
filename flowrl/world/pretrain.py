"""Pre-training the embedded world's base model by flow matching on rendered train- and test-split images.

The model is a pixel-space tiny ``FluxPipeline`` (no VAE; ``patch x patch`` pixel tokens) built by
:func:`flowrl.backbones.tiny.tiny_flux_pipeline` over the world's :func:`~flowrl.world.vocabulary`. Each
step draws ``batch_size`` (image, prompt) pairs of the ``"train"`` split (never a held-out colour-shape
pair), packs the pixels in [-1, 1] as ``x0`` (:meth:`FluxAdapter.encode_images`), draws noise ``eps`` and
a noise level ``s`` in (0, 1), forms ``x_s = (1 - s) x0 + s eps`` and regresses the transformer's output
on ``v = eps - x0`` (mean squared error). The transformer is called through
:meth:`FluxAdapter.velocity` (``timestep = s``), the very call sampling and RL make, so the convention
cannot drift. The text encoders (CLIP pooled vector, T5 tokens) train jointly by default; their
encodings are computed with gradients here, never through the adapter's prompt cache.

A pre-training recipe is a small TOML file of its own (``recipes/pretrain/world_clean.toml``, stage 1 from
random weights; ``recipes/pretrain/world.toml``, stage 2 from stage 1's output)::

    name, seed, output_dir, init    top level ("" output_dir: the shipped flowrl/world/base_model;
                                    init: a saved world pipeline to start from)
    [model]   TinyFluxSpec sizes    (pixel space; see :class:`ModelConfig`)
    [train]   steps, batch, AdamW, noise-level distribution, EMA, data pool (:class:`TrainConfig`)
    [eval]    held-out / train verifier scores with the ODE sampler (:class:`EvalConfig`)

The result is saved with ``FluxPipeline.save_pretrained`` (fp32 safetensors) plus ``pretrain.toml``
(the resolved recipe) and ``pretrain.json`` (scores, timings); it loads as the ``world_tiny`` backbone.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import time
import tomllib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import attrs
import numpy as np
import torch
from attrs.validators import ge, gt, in_, le, lt
from tqdm.auto import tqdm

from flowrl.backbones.flux import FluxAdapter
from flowrl.backbones.tiny import TinyFluxSpec, tiny_flux_pipeline
from flowrl.config import ConfigError, structure, unstructure
from flowrl.recipe import RecipeError, _apply_override
from flowrl.types import Conditioning
from flowrl.world.grammar import COLOUR_NAMES, PRETRAIN_SPLITS, TRAIN_PAIRS, Scene, sample_scenes, vocabulary
from flowrl.world.render import Lattice, render_batch

positive: Any = gt(0)


# -- the recipe --------------------------------------------------------------------------------------
@attrs.frozen
class ModelConfig:
    """Sizes of the pixel-space tiny FLUX (the :class:`~flowrl.backbones.tiny.TinyFluxSpec` fields).

    The defaults here and in :class:`TrainConfig` are those of stage 1 of the shipped base model
    (``recipes/pretrain/world_clean.toml``).
    """

    image_size: int = attrs.field(default=32, validator=positive)
    patch: int = attrs.field(default=4, validator=positive)  # pixels per token side: (32/4)^2 = 64 tokens
    num_layers: int = attrs.field(default=2, validator=ge(0))  # double-stream blocks
    num_single_layers: int = attrs.field(default=2, validator=ge(0))  # single-stream blocks
    attention_head_dim: int = attrs.field(default=16, validator=positive)
    num_attention_heads: int = attrs.field(default=4, validator=positive)  # width = heads x head dim
    axes_dims_rope: tuple[int, int, int] = (4, 6, 6)  # must sum to attention_head_dim
    joint_attention_dim: int = attrs.field(default=32, validator=positive)  # T5 width
    pooled_projection_dim: int = attrs.field(default=32, validator=positive)  # CLIP width
    text_hidden: int = attrs.field(default=64, validator=positive)  # text encoders' feed-forward width
    text_layers: int = attrs.field(default=2, validator=positive)
    text_heads: int = attrs.field(default=2, validator=positive)
    max_length: int = attrs.field(default=16, validator=positive)  # tokenizer length (world_tiny's default)
    shift: float = attrs.field(default=3.0, validator=positive)  # the saved scheduler's shift

    def spec(self) -> TinyFluxSpec:
        return TinyFluxSpec(pixel_space=True, guidance_embeds=False, **attrs.asdict(self))


def _level(_: Any, attribute: Any, value: float) -> None:
    if not 0 <= value <= 255:
        raise ValueError(f"{attribute.name} levels must lie in [0, 255], got {value}")


def _cell_range(_: Any, attribute: Any, value: tuple[int, int]) -> None:
    if not 1 <= value[0] <= value[1]:
        raise ValueError(f"{attribute.name} must be [min, max] with 1 <= min <= max, got {list(value)}")


@attrs.frozen
class TrainConfig:
    """The optimisation (``[train]``)."""

    steps: int = attrs.field(default=4000, validator=positive)  # optimizer steps
    batch_size: int = attrs.field(default=64, validator=positive)
    lr: float = attrs.field(default=1e-3, validator=positive)  # AdamW peak learning rate
    weight_decay: float = attrs.field(default=0.01, validator=ge(0))
    warmup_steps: int = attrs.field(default=200, validator=ge(0))  # linear warm-up
    lr_schedule: Literal["constant", "cosine"] = attrs.field(default="cosine", validator=in_(("constant", "cosine")))
    min_lr_ratio: float = attrs.field(default=0.1, validator=[ge(0), le(1)])  # cosine floor, times lr
    max_grad_norm: float = attrs.field(default=1.0, validator=positive)
    # noise level s: "uniform" on (0, 1) or "logit_normal" (sigmoid of N(logit_mean, logit_std^2)), then
    # shifted like the sampling grid, s <- k s / (1 + (k - 1) s) with k = timestep_shift (1: unchanged)
    timesteps: Literal["uniform", "logit_normal"] = attrs.field(
        default="logit_normal", validator=in_(("uniform", "logit_normal"))
    )
    logit_mean: float = 0.0
    logit_std: float = attrs.field(default=1.0, validator=positive)
    timestep_shift: float = attrs.field(default=1.0, validator=positive)
    train_text_encoders: bool = True  # train CLIP and T5 jointly with the transformer
    ema_decay: float = attrs.field(default=0.999, validator=[ge(0), lt(1)])  # 0: no EMA; EMA weights are saved
    # probability that an image is rendered for a miscaptioned scene (one group in another colour), as web
    # alt-text is sometimes wrong: the base model then draws the named colour only part of the time
    caption_noise: float = attrs.field(default=0.0, validator=[ge(0), le(1)])
    # objects on a lattice of this many pixels (at 32 px; 4 = the model's token size); 0: anywhere
    object_grid: float = attrs.field(default=0.0, validator=ge(0))
    object_cells: tuple[int, int] = attrs.field(default=(2, 3), validator=_cell_range)  # cells per object side
    # (): varied tinted backgrounds with a gradient; levels: a plain grey, one of these (0-255) per image
    background_levels: tuple[float, ...] = attrs.field(default=(), validator=attrs.validators.deep_iterable(_level))
    pool_size: int = attrs.field(default=32768, validator=ge(0))  # images rendered once up front; 0: fresh each step
    log_every: int = attrs.field(default=250, validator=ge(0))  # a log line every this many steps (0: none)
    checkpoint_every: int = attrs.field(default=0, validator=ge(0))  # <output>/checkpoints/step-N (0: none)
    threads: int = attrs.field(default=1, validator=ge(0))  # torch.set_num_threads (0: leave as is)
    device: Literal["cpu", "cuda", "auto"] = attrs.field(default="cpu", validator=in_(("cpu", "cuda", "auto")))
    render_workers: int = attrs.field(default=1, validator=positive)  # processes rendering the pool (same pool)

    def lattice(self) -> Lattice | None:
        """Where the renderer puts objects: on ``object_grid`` cells, or anywhere (None)."""
        return Lattice(self.object_grid, self.object_cells) if self.object_grid else None


@attrs.frozen
class EvalConfig:
    """Verifier scores of ODE samples on held-out and train prompts (``[eval]``)."""

    every: int = attrs.field(default=250, validator=ge(0))  # steps between evaluations (0: only at the end)
    prompts: int = attrs.field(default=64, validator=positive)  # held-out prompts (WorldPrompts' default 64)
    num_steps: int = attrs.field(default=16, validator=positive)  # ODE steps
    shift: float = attrs.field(default=3.0, validator=positive)  # sampling grid shift
    seed: int = attrs.field(default=0, validator=ge(0))  # initial noise


@attrs.frozen
class PretrainRecipe:
    """A pre-training recipe (``flowrl pretrain``)."""

    name: str = "world"
    seed: int = attrs.field(default=0, validator=ge(0))  # weights, data and noise
    output_dir: str = ""  # "": the shipped base model, flowrl/world/base_model/
    # a saved world pipeline to start from (a second pre-training stage); "": random initialisation.
    # A relative path is looked up from the current directory, then from the repository root.
    init: str = ""
    model: ModelConfig = attrs.field(factory=ModelConfig)
    train: TrainConfig = attrs.field(factory=TrainConfig)
    eval: EvalConfig = attrs.field(factory=EvalConfig)


class PretrainRecipeError(RecipeError):
    """Problems in a pre-training recipe, reported on one line (the file, then each key and problem)."""

    def report(self) -> str:
        n = len(self.problems)
        items = "; ".join(f"[{path}] {msg}" for path, msg in self.problems)
        return f"recipe error: {n} problem{'s' if n != 1 else ''} in {self.source}: {items}"


def load_pretrain_recipe(path: str | Path, overrides: Sequence[str] = ()) -> PretrainRecipe:
    """Read, override (``table.key=value``) and validate a pre-training recipe; raise :class:`PretrainRecipeError`."""
    source = str(path)
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PretrainRecipeError(source, [("file", "no such recipe file")]) from None
    except (OSError, UnicodeDecodeError) as error:
        raise PretrainRecipeError(source, [("file", f"cannot read: {error}")]) from None
    except tomllib.TOMLDecodeError as error:
        raise PretrainRecipeError(source, [("toml", f"syntax error: {error}")]) from None
    return pretrain_recipe_from_dict(data, overrides, source)


def pretrain_recipe_from_dict(
    data: dict[str, Any], overrides: Sequence[str] = (), source: str = "<recipe>"
) -> PretrainRecipe:
    """Validate parsed recipe data; every problem is collected before raising."""
    data = copy.deepcopy(dict(data))
    problems: list[tuple[str, str]] = []
    for item in overrides:
        _apply_override(data, item, problems)
    recipe = None
    if not problems:
        try:
            recipe = structure(PretrainRecipe, data)
        except ConfigError as error:
            problems.extend(error.problems)
    if recipe is not None:
        try:
            recipe.model.spec()
        except ValueError as error:
            problems.append(("model", str(error)))
        if recipe.init and not (resolve_folder(recipe.init) / "model_index.json").exists():
            problems.append(("init", f"no saved pipeline (model_index.json) in {recipe.init}"))
        try:
            training_device(recipe.train.device)
        except RuntimeError:
            problems.append(("train.device", NO_CUDA))
    if problems or recipe is None:
        raise PretrainRecipeError(source, problems)
    return recipe


# -- the model ---------------------------------------------------------------------------------------
class _Adapter(FluxAdapter):
    """The FLUX adapter around a pipeline built here (so velocity and decoding match the world_tiny backbone)."""

    def __init__(self, pipe: Any, config: Any) -> None:
        self._fresh = pipe
        super().__init__(config)

    def load_pipeline(self) -> Any:
        return self._fresh


def build_backbone(model: ModelConfig, seed: int) -> FluxAdapter:
    """A randomly initialised pixel-space tiny FLUX over the world's vocabulary, behind the FLUX adapter."""
    from flowrl.world.components import WorldTiny

    spec = model.spec()
    pipe = tiny_flux_pipeline(spec, words=vocabulary(), seed=seed)
    config = WorldTiny.Config(resolution=spec.image_size, max_sequence_length=spec.max_length)
    return _Adapter(pipe, config)


def parameter_counts(backbone: FluxAdapter) -> dict[str, int]:
    """Parameters of the transformer and of the two text encoders."""
    names = ("transformer", "text_encoder", "text_encoder_2")
    return {name: sum(p.numel() for p in getattr(backbone.pipe, name).parameters()) for name in names}


def forward_ms(backbone: FluxAdapter, batch: int = 32, repeats: int = 10) -> float:
    """Median wall time (ms) of one transformer forward at ``batch`` rows (no gradients)."""
    cond = backbone.encode(["a red circle"] * batch)
    x = torch.randn(batch, *backbone.latent_shape)
    s = torch.full((batch,), 0.5)
    times = []
    with torch.no_grad():
        backbone.velocity(x, s, cond)
        for _ in range(repeats):
            start = time.perf_counter()
            backbone.velocity(x, s, cond)
            times.append(time.perf_counter() - start)
    backbone._cache.clear()
    return 1000.0 * float(np.median(times))


@contextlib.contextmanager
def _swapped_in(params: list[tuple[str, torch.nn.Parameter]], shadow: dict[str, torch.Tensor] | None) -> Iterator[None]:
    """Temporarily load EMA weights (``shadow``) into ``params``; a no-op without EMA."""
    if shadow is None:
        yield
        return
    saved = [p.detach().clone() for _, p in params]
    with torch.no_grad():
        for name, p in params:
            p.copy_(shadow[name])
    try:
        yield
    finally:
        with torch.no_grad():
            for (_, p), value in zip(params, saved, strict=True):
                p.copy_(value)


def resolve_folder(path: str) -> Path:
    """``path`` as given if it exists, else relative to the repository root (where ``flowrl/`` lives)."""
    given = Path(path)
    if given.exists() or given.is_absolute():
        return given
    return Path(__file__).resolve().parents[2] / given


def load_initial_weights(backbone: FluxAdapter, init: str) -> None:
    """Copy the transformer and text-encoder weights of the saved pipeline ``init`` into ``backbone``."""
    from flowrl.backbones.tiny import load_tiny_flux

    folder = resolve_folder(init)
    saved = load_tiny_flux(folder)
    for name in ("transformer", "text_encoder", "text_encoder_2"):
        try:
            getattr(backbone.pipe, name).load_state_dict(getattr(saved, name).state_dict())
        except RuntimeError as error:
            first = str(error).strip().splitlines()[-1].strip()
            raise PretrainRecipeError(str(folder), [("init", f"does not fit [model]: {name}: {first}")]) from None


NO_CUDA = "'cuda' but torch sees no CUDA device; use 'auto' or 'cpu'"


def training_device(name: str) -> torch.device:
    """``train.device``: "auto" is CUDA when available, else the CPU; "cuda" without CUDA is an error."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"train.device = {NO_CUDA}")
    return torch.device(name)


def miscaptioned(scenes: Sequence[Scene], rate: float, seed: int) -> list[Scene]:
    """The scenes to draw for ``scenes``' captions: each, with probability ``rate``, has one group recoloured
    (to a colour whose pair with the shape is a train pair and differs from the other group's)."""
    rng = np.random.default_rng((seed, 0x6E6F))
    drawn = list(scenes)
    for k, scene in enumerate(scenes):
        if rate == 0 or rng.random() >= rate:
            continue
        i = int(rng.integers(len(scene.groups)))
        group = scene.groups[i]
        taken = {g.pair for j, g in enumerate(scene.groups) if j != i}
        colours = [
            c
            for c in COLOUR_NAMES
            if c != group.colour and (c, group.shape) in TRAIN_PAIRS and (c, group.shape) not in taken
        ]
        groups = list(scene.groups)
        groups[i] = attrs.evolve(group, colour=colours[int(rng.integers(len(colours)))])
        drawn[k] = attrs.evolve(scene, groups=tuple(groups))
    return drawn


def render_parallel(
    scenes: Sequence[Any],
    seed: int,
    size: int,
    workers: int,
    lattice: Lattice | None = None,
    flat: Sequence[float] = (),
) -> np.ndarray:
    """:func:`~flowrl.world.render.render_batch` split over ``workers`` processes: the same images (image ``i``
    depends only on ``seed, i, scenes[i]``), in a fraction of the time."""
    if workers <= 1 or len(scenes) < 2 * workers:
        return render_batch(scenes, seed, size, lattice=lattice, flat=flat)
    import concurrent.futures
    import multiprocessing

    bounds = np.linspace(0, len(scenes), workers + 1).astype(int)
    jobs = [
        (list(scenes[a:b]), seed, size, int(a), lattice, tuple(flat))
        for a, b in zip(bounds[:-1], bounds[1:], strict=True)
    ]
    methods = multiprocessing.get_all_start_methods()  # fork: workers need only numpy and PIL, no re-import
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        parts = list(pool.map(_render_part, jobs))
    return np.concatenate(parts)


def _render_part(job: tuple[list[Any], int, int, int, Lattice | None, tuple[float, ...]]) -> np.ndarray:
    scenes, seed, size, start, lattice, flat = job
    return render_batch(scenes, seed, size, start, lattice, flat)


# -- the loop ----------------------------------------------------------------------------------------
@attrs.define
class PretrainResult:
    """What :func:`pretrain` did: the output folder, the loss per step, evaluations and timings."""

    output_dir: Path
    losses: list[float]
    evals: list[dict[str, float]]
    wall_s: float
    parameters: dict[str, int]


class Pretrainer:
    """Flow-matching pre-training of the world's tiny FLUX; :meth:`run` is the whole job."""

    def __init__(self, recipe: PretrainRecipe, output_dir: str | Path | None = None, quiet: bool = False) -> None:
        from flowrl.world.components import BASE_MODEL

        self.recipe = recipe
        self.cfg = recipe.train
        self.quiet = quiet
        self.output_dir = Path(output_dir or recipe.output_dir or BASE_MODEL)
        if self.cfg.threads:
            torch.set_num_threads(self.cfg.threads)
        torch.manual_seed(recipe.seed)
        self.generator = torch.Generator().manual_seed(recipe.seed)
        self.backbone = build_backbone(recipe.model, recipe.seed)
        if recipe.init:
            load_initial_weights(self.backbone, recipe.init)
        self.device = training_device(self.cfg.device)
        if self.device.type != "cpu":
            torch.backends.cuda.matmul.allow_tf32 = True
            self.backbone.to(self.device)
        pipe = self.backbone.pipe
        modules = [pipe.transformer]
        if self.cfg.train_text_encoders:
            modules += [pipe.text_encoder, pipe.text_encoder_2]
        self.modules = modules
        for module in modules:
            module.requires_grad_(True)
        self.params = [(f"{i}.{n}", p) for i, m in enumerate(modules) for n, p in m.named_parameters()]
        self.optimizer = torch.optim.AdamW(
            [p for _, p in self.params], lr=self.cfg.lr, weight_decay=self.cfg.weight_decay
        )
        self.lr_schedule = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        self.ema = None
        if self.cfg.ema_decay > 0:
            from flowrl.trainer.ema import EMA

            self.ema = EMA(self.params, self.cfg.ema_decay)
        self.pool: torch.Tensor | None = None
        self.pool_prompts: list[str] = []
        self.step = 0

    # -- pieces -----------------------------------------------------------------------------------
    def _lr_factor(self, k: int) -> float:
        warm = self.cfg.warmup_steps
        if k < warm:
            return (k + 1) / warm
        if self.cfg.lr_schedule == "constant":
            return 1.0
        progress = min(1.0, (k - warm) / max(1, self.cfg.steps - warm))
        floor = self.cfg.min_lr_ratio
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    def render_pool(self) -> None:
        """Render ``pool_size`` images of train- and test-split scenes once (kinds drawn uniformly)."""
        n = self.cfg.pool_size
        scenes = sample_scenes(PRETRAIN_SPLITS, n, self.recipe.seed)
        drawn = miscaptioned(scenes, self.cfg.caption_noise, self.recipe.seed)
        size = self.recipe.model.image_size
        images = render_parallel(
            drawn, self.recipe.seed, size, self.cfg.render_workers, self.cfg.lattice(), self.cfg.background_levels
        )
        self.pool = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()
        self.pool_prompts = [s.text for s in scenes]

    def batch(self, step: int) -> tuple[torch.Tensor, list[str]]:
        """One batch of train- and test-split images ``(B, 3, H, W)`` in [0, 1] and their prompts."""
        b = self.cfg.batch_size
        if self.pool is not None:
            index = torch.randint(len(self.pool), (b,), generator=self.generator)
            images = self.pool[index].to(self.device).float() / 255.0
            return images, [self.pool_prompts[int(i)] for i in index]
        seed = self.recipe.seed * 1_000_003 + step + 1
        scenes = sample_scenes(PRETRAIN_SPLITS, b, seed)
        noisy = miscaptioned(scenes, self.cfg.caption_noise, seed)
        size = self.recipe.model.image_size
        drawn = render_batch(noisy, seed, size, lattice=self.cfg.lattice(), flat=self.cfg.background_levels)
        pixels = torch.from_numpy(drawn).permute(0, 3, 1, 2).to(self.device).float() / 255.0
        return pixels, [s.text for s in scenes]

    def encode(self, prompts: list[str]) -> Conditioning:
        """Prompt encodings with gradients into the text encoders (the adapter's cache is bypassed)."""
        with contextlib.nullcontext() if self.cfg.train_text_encoders else torch.no_grad():
            embeds, pooled, text_ids = self.backbone.pipe.encode_prompt(
                prompt=prompts,
                prompt_2=None,
                device=self.backbone.device,
                max_sequence_length=self.backbone.config.max_sequence_length,
            )
        self.backbone._text_ids = text_ids
        return Conditioning({"embeds": embeds.float(), "pooled": pooled.float()})

    def noise_levels(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """``n`` noise levels in (0, 1) from the recipe's distribution."""
        if self.cfg.timesteps == "uniform":
            s = torch.rand(n, generator=generator)
        else:
            s = torch.sigmoid(self.cfg.logit_mean + self.cfg.logit_std * torch.randn(n, generator=generator))
        k = self.cfg.timestep_shift
        s = k * s / (1 + (k - 1) * s)
        return s.clamp(1e-5, 1 - 1e-5)

    def loss(self, images: torch.Tensor, prompts: list[str], generator: torch.Generator) -> torch.Tensor:
        """The flow-matching loss ``|v_theta(x_s, s) - (eps - x0)|^2`` on one batch."""
        x0 = self.backbone.encode_images(images)
        eps = torch.randn(x0.shape, generator=generator).to(x0.device)  # drawn on the CPU: same on any device
        s = self.noise_levels(len(images), generator).to(x0.device)
        xs = (1 - s[:, None, None]) * x0 + s[:, None, None] * eps
        v = self.backbone.velocity(xs, s, self.encode(prompts))
        return torch.nn.functional.mse_loss(v, eps - x0)

    def train_step(self, images: torch.Tensor, prompts: list[str], generator: torch.Generator) -> float:
        """One AdamW step on one batch; returns the loss before the step."""
        for module in self.modules:
            module.train()
        loss = self.loss(images, prompts, generator)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for _, p in self.params], self.cfg.max_grad_norm)
        self.optimizer.step()
        self.lr_schedule.step()
        if self.ema is not None:  # warm-up of the decay so the random initialisation fades fast
            self.ema.decay = min(self.cfg.ema_decay, (1 + self.step) / (10 + self.step))
            self.ema.update()
        self.step += 1
        return float(loss.detach())

    def weights(self) -> contextlib.AbstractContextManager[None]:
        """Context in which the model holds the weights to evaluate and save (EMA when enabled)."""
        return _swapped_in(self.params, None if self.ema is None else self.ema.shadow)

    def evaluate(self) -> dict[str, float]:
        """Verifier figures of ODE samples on balanced test- and novel-split prompts (``eval.prompts`` each):
        ``test/score``, ``test/strict``, ``test/strict/single`` (single objects), ``novel/score``, ..."""
        import flowrl
        from flowrl.evaluate import evaluate
        from flowrl.types import Schedule
        from flowrl.world.components import WorldPrompts, WorldVerifier

        e = self.recipe.eval
        sigmas = self.backbone.schedule_sigmas(e.num_steps, e.shift)
        schedule = Schedule(sigmas, flowrl.build("kernel", {"type": "ode"}))
        reward = [("world", 1.0, WorldVerifier(WorldVerifier.Config()))]
        pipe = self.backbone.pipe
        for module in (pipe.transformer, pipe.text_encoder, pipe.text_encoder_2):
            module.eval()
        out: dict[str, float] = {}
        with self.weights():
            for split in ("test", "novel"):
                prompts = WorldPrompts(WorldPrompts.Config(eval_split=split, eval_count=e.prompts)).heldout()
                self.backbone._cache.clear()  # the text encoders have changed since the last evaluation
                figures = evaluate(self.backbone, prompts, reward, schedule, seed=e.seed)
                for key in ("score", "strict", "strict/single"):
                    out[f"{split}/{key}"] = figures[key]
        self.backbone._cache.clear()
        return out

    def save(self, folder: Path) -> None:
        """``save_pretrained`` (fp32 safetensors) with the weights of :meth:`weights`."""
        from transformers.utils import logging as hf_logging

        folder.mkdir(parents=True, exist_ok=True)
        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # no "Writing model shards" bar per text encoder
        try:
            with self.weights():
                self.backbone.pipe.to("cpu").save_pretrained(folder, safe_serialization=True)
        finally:
            self.backbone.pipe.to(self.device)
            if bars:
                hf_logging.enable_progress_bar()

    def log(self, message: str) -> None:
        tqdm.write(message)

    # -- the whole job ----------------------------------------------------------------------------
    def run(self) -> PretrainResult:
        cfg = self.cfg
        counts = parameter_counts(self.backbone)
        self.log(
            f"pretrain {self.recipe.name}: transformer {counts['transformer']:,} params, text encoders "
            f"{counts['text_encoder'] + counts['text_encoder_2']:,}; {cfg.steps} steps at batch {cfg.batch_size}"
        )
        start = time.perf_counter()
        if cfg.pool_size:
            self.render_pool()
            self.log(f"rendered {cfg.pool_size} train- and test-split images in {time.perf_counter() - start:.1f}s")
        losses: list[float] = []
        evals: list[dict[str, float]] = []
        eval_s = 0.0
        smooth = float("nan")
        bar = tqdm(total=cfg.steps, desc=f"pretrain {self.recipe.name}", disable=self.quiet)
        try:
            while self.step < cfg.steps:
                images, prompts = self.batch(self.step)
                loss = self.train_step(images, prompts, self.generator)
                if not math.isfinite(loss):
                    raise FloatingPointError(f"the loss is {loss} at step {self.step}; lower train.lr")
                losses.append(loss)
                smooth = loss if math.isnan(smooth) else 0.98 * smooth + 0.02 * loss
                bar.update(1)
                bar.set_postfix(loss=f"{smooth:.4f}")
                if cfg.log_every and self.step % cfg.log_every == 0:
                    recent = float(np.mean(losses[-cfg.log_every :]))
                    wall = time.perf_counter() - start - eval_s
                    lr = self.lr_schedule.get_last_lr()[0]
                    self.log(f"step {self.step}/{cfg.steps}  loss {recent:.4f}  lr {lr:.2e}  {wall:.0f}s")
                every = self.recipe.eval.every
                if (every and self.step % every == 0) or self.step == cfg.steps:
                    t0 = time.perf_counter()
                    figures = {"step": self.step, **self.evaluate()}
                    eval_s += time.perf_counter() - t0
                    evals.append(figures)
                    self.log(
                        f"eval step {self.step}: test score {figures['test/score']:.3f} strict "
                        f"{figures['test/strict']:.3f} (single objects {figures['test/strict/single']:.3f}) | "
                        f"novel score {figures['novel/score']:.3f} strict {figures['novel/strict']:.3f}"
                    )
                if cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0 and self.step < cfg.steps:
                    self.save(self.output_dir / "checkpoints" / f"step-{self.step}")
        finally:
            bar.close()
        wall = time.perf_counter() - start - eval_s
        self.save(self.output_dir)
        self._write_provenance(losses, evals, wall, counts)
        self.log(f"saved {self.output_dir} after {self.step} steps, {wall:.0f}s of training")
        return PretrainResult(self.output_dir, losses, evals, wall, counts)

    def _write_provenance(
        self, losses: list[float], evals: list[dict[str, float]], wall: float, counts: dict[str, int]
    ) -> None:
        from flowrl.tomlwrite import dumps

        recipe = unstructure(self.recipe)
        recipe["output_dir"] = self.recipe.output_dir
        (self.output_dir / "pretrain.toml").write_text(
            "# The resolved recipe this model was pre-trained with: flowrl pretrain <this file>\n" + dumps(recipe)
        )
        tail = losses[-min(len(losses), 100) :]
        info = {
            "steps": self.step,
            "train_wall_s": round(wall, 1),
            "final_loss": float(np.mean(tail)) if tail else None,
            "parameters": counts,
            "evals": evals,
            "torch": torch.__version__,
        }
        (self.output_dir / "pretrain.json").write_text(json.dumps(info, indent=1) + "\n")


def pretrain(recipe: PretrainRecipe, output_dir: str | Path | None = None, quiet: bool = False) -> PretrainResult:
    """Pre-train as ``recipe`` says and save the pipeline into ``output_dir`` (default: the recipe's)."""
    return Pretrainer(recipe, output_dir, quiet).run()
