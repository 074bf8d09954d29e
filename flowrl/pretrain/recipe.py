"""A pre-training recipe: a small TOML file of its own, read and validated like an RL recipe.

``recipes/pretrain/world_clean.toml`` is stage 1 (from random weights), ``recipes/pretrain/world.toml``
stage 2 (from stage 1's output)::

    name, seed, output_dir, init    top level ("" output_dir: the shipped flowrl/world/base_model;
                                    init: a saved world pipeline to start from)
    task                            "text_to_image" (scenes from captions) or "edit" (the edit base from
                                    source, instruction, target triples; recipes/pretrain/world_edit.toml)
    [model]   TinyFluxSpec sizes    (pixel space; see :class:`ModelConfig`)
    [train]   steps, batch, AdamW, noise-level distribution, EMA, data pool (:class:`TrainConfig`)
    [eval]    test- and novel-split verifier scores with the ODE sampler (:class:`EvalConfig`)

Every problem (unknown key, bad value, a model the tiny FLUX cannot build, a missing ``init`` folder) is
collected and reported on one line by :class:`PretrainRecipeError`.
"""

from __future__ import annotations

import copy
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import attrs
import torch
from attrs.validators import ge, gt, le, lt

from flowrl.backbones.flux.tiny import TinyFluxSpec
from flowrl.config.recipe import RecipeError, apply_override
from flowrl.core.choices import one_of
from flowrl.core.convert import ConfigError, structure
from flowrl.world.render import Lattice

positive: Any = gt(0)
LrSchedule = Literal["constant", "cosine"]
Timesteps = Literal["uniform", "logit_normal"]
Device = Literal["cpu", "cuda", "auto"]
Task = Literal["text_to_image", "edit"]


@attrs.frozen
class ModelConfig:
    """Sizes of the pixel-space tiny FLUX (the :class:`~flowrl.backbones.flux.tiny.TinyFluxSpec` fields).

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
    lr_schedule: LrSchedule = attrs.field(default="cosine", validator=one_of(LrSchedule))
    min_lr_ratio: float = attrs.field(default=0.1, validator=[ge(0), le(1)])  # cosine floor, times lr
    max_grad_norm: float = attrs.field(default=1.0, validator=positive)
    # noise level s: "uniform" on (0, 1) or "logit_normal" (sigmoid of N(logit_mean, logit_std^2)), then
    # shifted like the sampling grid, s <- k s / (1 + (k - 1) s) with k = timestep_shift (1: unchanged)
    timesteps: Timesteps = attrs.field(default="logit_normal", validator=one_of(Timesteps))
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
    device: Device = attrs.field(default="cpu", validator=one_of(Device))
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
    # "text_to_image": the world base (caption -> scene); "edit": the edit base (source + instruction -> target)
    task: Task = attrs.field(default="text_to_image", validator=one_of(Task))
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
        data = tomllib.loads(Path(path).read_text(encoding="utf-8-sig"))
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
        apply_override(data, item, problems)
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


def resolve_folder(path: str) -> Path:
    """``path`` as given if it exists, else relative to the repository root (where ``flowrl/`` lives)."""
    given = Path(path)
    if given.exists() or given.is_absolute():
        return given
    return Path(__file__).resolve().parents[2] / given


NO_CUDA = "'cuda' but torch sees no CUDA device; use 'auto' or 'cpu'"


def training_device(name: str) -> torch.device:
    """``train.device``: "auto" is CUDA when available, else the CPU; "cuda" without CUDA is an error."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"train.device = {NO_CUDA}")
    return torch.device(name)
