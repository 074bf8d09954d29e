"""Held-out evaluation during training: the figures of the current policy on the prompt source's evaluation
prompts (deterministic ODE samples), and the row of sample images the run folder keeps of each evaluation (with
the prompts' condition images beside it, for flowrl report, where the prompts carry any)."""

from __future__ import annotations

from pathlib import Path

import torch

from flowrl.config.settings import TrainerConfig
from flowrl.core.interfaces import PromptSource
from flowrl.core.types import Schedule
from flowrl.rewards.built import BuiltReward
from flowrl.trainer.logger import SamplePrompts, write_grid
from flowrl.trainer.policy import TrainedPolicy

Grid = tuple[torch.Tensor, list[str]]


class HeldOut:
    """Evaluates the trained policy; the NFE it spends is not counted towards the training budget."""

    def __init__(
        self,
        prompts: PromptSource,
        rewards: list[BuiltReward],
        schedule: Schedule,
        cfg: TrainerConfig,
        policy: TrainedPolicy,
    ) -> None:
        self.prompts, self.rewards, self.schedule, self.cfg = prompts, rewards, schedule, cfg
        self.policy, self.backbone, self.accelerator = policy, policy.backbone, policy.accelerator
        self._grid: tuple[int, Grid | None] | None = None  # the last sample row and the step it was drawn at

    def evaluate(self, grid_file: Path, step: int) -> dict[str, float]:
        """Figures keyed ``eval/...`` (``{}`` without evaluation prompts) of the policy after ``step``
        iterations; the sample row goes to ``grid_file``. The rewards are weighted as at iteration ``step`` (a
        scheduled weight's value there), so any weighted total of an evaluation is the one training uses next."""
        from flowrl.evaluation.evaluate import evaluate

        prompts = self.prompts.heldout()[: self.cfg.eval_prompts]
        if not prompts:
            return {}
        self.backbone.module.eval()
        with self.policy.inference(), self.backbone.uncounted():  # evaluation is not part of the training budget
            rewards = [reward.at(step) for reward in self.rewards]
            result = evaluate(self.backbone, prompts, rewards, self.schedule, self.cfg.eval_seed)
            grid = self.grid(step)
        if grid is not None and self.accelerator.is_main_process:
            write_grid(grid, grid_file)
        return {f"eval/{k}": v for k, v in result.items() if k not in ("nfe", "prompts")}

    def grid(self, step: int) -> Grid | None:
        """Deterministic ODE samples (seed 0) of the policy after ``step`` iterations for the first 8 held-out
        (or training) prompts, and the prompts; None where this process has no part in them
        (``trainer.image_every = 0``, or not the main process of an unsharded run; when sharded every process
        takes part in the forwards). Drawn once per step: a checkpoint at an evaluation's step reuses its row."""
        from flowrl.evaluation.evaluate import ode_images

        if self._grid is not None and self._grid[0] == step:
            return self._grid[1]
        grid: Grid | None = None
        if self.cfg.image_every and (self.accelerator.is_main_process or self.policy.sharded):
            prompts = (self.prompts.heldout() or self.prompts.sample(8, torch.Generator().manual_seed(0)))[:8]
            meaning = type(self.backbone).accepts(getattr(self.backbone, "config", None)).meaning  # "the source image"
            grid = ode_images(self.backbone, prompts, self.schedule, seed=0), SamplePrompts(prompts, meaning)
        self._grid = (step, grid)
        return grid
