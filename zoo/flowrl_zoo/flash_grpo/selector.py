"""Flash-GRPO's candidate window: the steps from which each prompt's single SDE step is drawn."""

from __future__ import annotations

import attrs
import torch
from attrs.validators import ge

from flowrl import Plan, Schedule, TimestepSelector, Unit, register


@register("selector", "flash_window")
class FlashWindow(TimestepSelector):
    """The candidate pool of Flash-GRPO: steps ``start .. start + size - 1``, one trained unit each (arXiv 2605.15980).

    ``size = 0`` (default) is half the grid, ``N // 2`` steps (at least 1): the release draws from the first 10 of
    its 20 steps. The plan lists the pool; it does not make every listed step stochastic. The ``iso_temporal``
    sampler draws one unit of it per prompt (the step ``k`` the whole group takes stochastically) and takes every
    other step by ODE.
    The pool is the same at every iteration and needs no state. The last step (into ``s = 0``) is refused: a
    stochastic step there leaves its noise in the scored image.
    """

    @attrs.frozen
    class Config:
        start: int = attrs.field(default=0, validator=ge(0))  # first candidate step
        size: int = attrs.field(default=0, validator=ge(0))  # candidate steps; 0: the first half, N // 2

    @staticmethod
    def window(config: Config, num_steps: int) -> tuple[int, int]:
        """``(start, end)``: the candidate steps ``start .. end - 1`` on a grid of ``num_steps`` steps."""
        size = config.size or max(1, num_steps // 2)
        return config.start, config.start + size

    @staticmethod
    def check_steps(config: Config, num_steps: int) -> list[tuple[str, str]]:
        end = FlashWindow.window(config, num_steps)[1]
        if end > num_steps - 1:
            return [("size", f"the window covers steps {config.start}..{end - 1}, but only steps 0..{num_steps - 2} "
                             f"may be stochastic (the schedule has {num_steps} steps; the last one goes to s = 0)")]
        return []

    def plan(self, schedule: Schedule, iteration: int, generator: torch.Generator) -> Plan:
        problems = self.check_steps(self.config, schedule.num_steps)
        if problems:
            raise ValueError(f"flash_window: {problems[0][1]}")
        start, end = self.window(self.config, schedule.num_steps)
        units = tuple(Unit(i) for i in range(start, end))
        return Plan(units=units, trained=tuple(range(end - start)), info={"window": (start, end)})
