"""Flow-GRPO's timestep selection: all steps stochastic, the first fraction trained."""

from __future__ import annotations

import attrs
import torch
from attrs.validators import gt, le

from flowrl import Plan, Schedule, TimestepSelector, Unit, register


@register("selector", "flow_grpo_prefix")
class FlowGRPOPrefix(TimestepSelector):
    """Every step SDE; train steps 0 .. int(N * fraction) - 1 (Flow-GRPO, arXiv 2505.05470, Sec. 4)."""

    provides = frozenset({"unit_every_step"})

    @attrs.frozen
    class Config:
        train_fraction: float = attrs.field(default=0.99, validator=[gt(0), le(1)])  # T=10, 0.99 -> steps 0..8

    def plan(self, schedule: Schedule, iteration: int, generator: torch.Generator) -> Plan:
        n = schedule.num_steps
        units = tuple(Unit(i) for i in range(n))
        trained = tuple(range(max(1, int(n * self.config.train_fraction))))
        return Plan(units=units, trained=trained)
