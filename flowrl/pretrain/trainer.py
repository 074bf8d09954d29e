"""Pre-training the embedded world's base model by flow matching on rendered train- and test-split images.

The model is a pixel-space tiny ``FluxPipeline`` (no VAE; ``patch x patch`` pixel tokens) built by
:func:`flowrl.backbones.flux.tiny.tiny_flux_pipeline` over the world's :func:`~flowrl.world.vocabulary`. Each
step draws ``batch_size`` (image, prompt) pairs of the ``"train"`` and ``"test"`` splits (never a
``"novel"`` colour-shape pair), packs the pixels in [-1, 1] as ``x0`` (:meth:`FluxAdapter.encode_images`),
draws noise ``eps`` and a noise level ``s`` in (0, 1), forms ``x_s = (1 - s) x0 + s eps`` and regresses
the transformer's output on ``v = eps - x0`` (mean squared error). The transformer is called through
:meth:`FluxAdapter.velocity` (``timestep = s``), the very call sampling and RL make, so the convention
cannot drift. The text encoders (CLIP pooled vector, T5 tokens) train jointly by default; their
encodings are computed with gradients here, never through the adapter's prompt cache.

The result is saved with ``FluxPipeline.save_pretrained`` (fp32 safetensors) plus ``pretrain.toml``
(the resolved recipe) and ``pretrain.json`` (scores, timings); it loads as the ``world_tiny`` backbone.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from pathlib import Path
from typing import Any, Literal

import attrs
import numpy as np
import torch
from tqdm.auto import tqdm

from flowrl.core.convert import unstructure
from flowrl.core.types import Conditioning
from flowrl.pretrain.data import miscaptioned, render_parallel
from flowrl.pretrain.model import build_backbone, load_initial_weights, parameter_counts, swapped_in
from flowrl.pretrain.recipe import PretrainRecipe, training_device
from flowrl.utils.lr_schedule import lr_factor
from flowrl.world.grammar import PRETRAIN_SPLITS, sample_scenes
from flowrl.world.render import render_batch

EvalSplit = Literal["test", "novel"]
EVAL_SPLITS: tuple[EvalSplit, ...] = ("test", "novel")  # what an evaluation during pre-training reports

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
        self.backbone = build_backbone(recipe.model, recipe.seed, recipe.task)
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
        c = self.cfg
        return lr_factor(k, c.warmup_steps, c.lr_schedule, c.steps, c.min_lr_ratio)

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
        return swapped_in(self.params, None if self.ema is None else self.ema.shadow)

    def evaluate(self) -> dict[str, float]:
        """Verifier figures of ODE samples on balanced test- and novel-split prompts (``eval.prompts`` each):
        ``test/score``, ``test/strict``, ``test/strict/single`` (single objects), ``novel/score``, ... (what
        :meth:`eval_reward`, :meth:`eval_prompts` and :meth:`eval_figures` say)."""
        import flowrl
        from flowrl.core.types import Schedule
        from flowrl.evaluation.evaluate import evaluate

        e = self.recipe.eval
        sigmas = self.backbone.schedule_sigmas(e.num_steps, e.shift)
        schedule = Schedule(sigmas, flowrl.build("kernel", {"type": "ode"}))
        reward = [self.eval_reward()]
        pipe = self.backbone.pipe
        for module in (pipe.transformer, pipe.text_encoder, pipe.text_encoder_2):
            module.eval()
        out: dict[str, float] = {}
        with self.weights():
            for split in EVAL_SPLITS:
                prompts = self.eval_prompts(split, e.prompts)
                self.backbone._cache.clear()  # the text encoders have changed since the last evaluation
                figures = evaluate(self.backbone, prompts, reward, schedule, seed=e.seed)
                out.update({f"{split}/{key}": value for key, value in self.eval_figures(figures).items()})
        self.backbone._cache.clear()
        return out

    def eval_reward(self) -> Any:
        """The evaluation's reward: the world's verifier."""
        from flowrl.rewards.built import BuiltReward
        from flowrl.world.components import WorldVerifier

        return BuiltReward("world", 1.0, WorldVerifier(WorldVerifier.Config()))

    def eval_prompts(self, split: EvalSplit, count: int) -> list[str]:
        """``count`` balanced held-out prompts of ``split``."""
        from flowrl.world.components import WorldPrompts

        return WorldPrompts(WorldPrompts.Config(eval_split=split, eval_count=count)).heldout()

    def eval_figures(self, figures: dict[str, float]) -> dict[str, float]:
        """The figures of one split the log keeps."""
        return {key: figures[key] for key in ("score", "strict", "strict/single")}

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

    def describe(self, figures: dict[str, float]) -> str:
        """The log line of one evaluation."""
        return (
            f"eval step {figures['step']}: test score {figures['test/score']:.3f} strict "
            f"{figures['test/strict']:.3f} (single objects {figures['test/strict/single']:.3f}) | "
            f"novel score {figures['novel/score']:.3f} strict {figures['novel/strict']:.3f}"
        )

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
                    self.log(self.describe(figures))
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
        from flowrl.config.tomlwrite import dumps

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
