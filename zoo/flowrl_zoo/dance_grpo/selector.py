"""DanceGRPO's timestep selection: all steps stochastic, a random fraction of them trained."""

from __future__ import annotations

import attrs
import torch
from attrs.validators import gt, le

from flowrl import Plan, Schedule, TimestepSelector, Unit, register


@register("selector", "dance_random_subset")
class DanceRandomSubset(TimestepSelector):
    """Every step SDE; train a random fraction of the steps, last step excluded (DanceGRPO, arXiv 2505.07818).

    The official code draws the subset per sample; here it is drawn once per iteration and shared by the
    batch (the expected number of trained transitions is the same).
    """

    provides = frozenset({"unit_every_step"})

    @attrs.frozen
    class Config:
        train_fraction: float = attrs.field(default=0.6, validator=[gt(0), le(1)])  # share of steps trained
        drop_last: bool = True  # never train the final step

    def plan(self, schedule: Schedule, iteration: int, generator: torch.Generator) -> Plan:
        n = schedule.num_steps
        units = tuple(Unit(i) for i in range(n))
        pool = n - 1 if self.config.drop_last and n > 1 else n
        k = max(1, int(pool * self.config.train_fraction))
        chosen = torch.randperm(pool, generator=generator)[:k].sort().values
        return Plan(units=units, trained=tuple(int(i) for i in chosen))
