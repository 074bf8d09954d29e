"""When a run stops and when it evaluates: ``trainer.max_steps``, ``max_nfe``, ``max_minutes``, ``eval_every``
and ``eval_every_nfe``."""

from __future__ import annotations

import time
from typing import Any

import torch

from flowrl.config.settings import TrainerConfig


class Budget:
    """The run's limits and evaluation triggers; ``start()`` when the loop starts (the time limit counts from
    there), ``tick()`` after every iteration (the slowest process decides whether the time is up)."""

    def __init__(self, cfg: TrainerConfig, accelerator: Any) -> None:
        self.cfg, self.accelerator = cfg, accelerator
        self.started = time.perf_counter()
        self.time_up = False

    def start(self) -> None:
        self.started = time.perf_counter()

    def finished(self, step: int, nfe: int) -> bool:
        """The step limit, the NFE budget or the time limit is reached."""
        budget = bool(self.cfg.max_nfe and nfe >= self.cfg.max_nfe)
        return step >= self.cfg.max_steps or budget or self.time_up

    @property
    def evaluates(self) -> bool:
        """Held-out evaluations are on (by iterations, by NFE or both)."""
        return bool(self.cfg.eval_every or self.cfg.eval_every_nfe)

    def evaluation_due(self, step: int, nfe_before: int, nfe: int) -> bool:
        """Evaluate after this iteration: every ``eval_every`` iterations, when this iteration's rollouts took
        the NFE count from ``nfe_before`` across a multiple of ``eval_every_nfe``, and after the last iteration."""
        cfg, every = self.cfg, self.cfg.eval_every_nfe
        by_step = bool(cfg.eval_every) and step % cfg.eval_every == 0
        by_nfe = bool(every) and nfe // every > nfe_before // every
        return self.evaluates and (by_step or by_nfe or self.finished(step, nfe))

    def tick(self) -> None:
        """Note whether ``trainer.max_minutes`` has passed since :meth:`start` (the slowest process decides)."""
        if not self.cfg.max_minutes:
            return
        elapsed = torch.tensor([time.perf_counter() - self.started], device=self.accelerator.device)
        if self.accelerator.num_processes > 1:
            elapsed = self.accelerator.reduce(elapsed, "max")
        self.time_up = float(elapsed) >= 60.0 * self.cfg.max_minutes
