"""Flow-GRPO-Fast's timestep selection: a short random SDE window early in the trajectory, ODE elsewhere."""

from __future__ import annotations

import math

import attrs
import torch
from attrs.validators import ge, gt, le, lt

from flowrl import Plan, Schedule, TimestepSelector, Unit, register


def _sizes_ordered(instance: object, _attr: object, value: int) -> None:
    if instance is not None and value < instance.min_size:  # type: ignore[attr-defined]
        raise ValueError(f"max_size must be >= min_size ({instance.min_size}), got {value}")  # type: ignore[attr-defined]


def _range_ordered(instance: object, _attr: object, value: float) -> None:
    if instance is not None and value <= instance.range_start:  # type: ignore[attr-defined]
        raise ValueError(f"range_end must be > range_start ({instance.range_start}), got {value}")  # type: ignore[attr-defined]


@register("selector", "flow_grpo_fast_window")
class FlowGRPOFastWindow(TimestepSelector):
    """A random window of 2-3 SDE steps in the first half, all trained; ODE elsewhere (Flow-GRPO-Fast, 2505.05470).

    The window has ``min_size..max_size`` consecutive steps inside steps ``[floor(range_start N),
    ceil(range_end N))``; every other step is ODE.
    At each iteration the size is drawn uniformly from ``min_size..max_size`` and then the start uniformly
    among the positions where the window fits in the range, both from the plan generator.
    """

    @attrs.frozen
    class Config:
        min_size: int = attrs.field(default=2, validator=ge(1))  # smallest window (SDE steps)
        max_size: int = attrs.field(default=3, validator=[ge(1), _sizes_ordered])  # largest window
        range_start: float = attrs.field(default=0.0, validator=[ge(0), lt(1)])  # range begins at floor(f N)
        range_end: float = attrs.field(default=0.5, validator=[gt(0), le(1), _range_ordered])  # ends at ceil(f N)

    @staticmethod
    def step_range(config: Config, num_steps: int) -> tuple[int, int]:
        """``(lo, hi)``: the window lies in steps ``lo .. hi - 1``."""
        lo = math.floor(config.range_start * num_steps + 1e-9)
        hi = min(num_steps, math.ceil(config.range_end * num_steps - 1e-9))
        return lo, hi

    @staticmethod
    def check_steps(config: Config, num_steps: int) -> list[tuple[str, str]]:
        lo, hi = FlowGRPOFastWindow.step_range(config, num_steps)
        if hi - lo < config.max_size:
            return [
                ("max_size", f"a window of {config.max_size} steps does not fit in steps {lo}..{hi - 1} of {num_steps}")
            ]
        return []

    def plan(self, schedule: Schedule, iteration: int, generator: torch.Generator) -> Plan:
        c = self.config
        problems = self.check_steps(c, schedule.num_steps)
        if problems:
            raise ValueError(f"flow_grpo_fast_window: {problems[0][1]}")
        lo, hi = self.step_range(c, schedule.num_steps)
        size = c.min_size + int(torch.randint(0, c.max_size - c.min_size + 1, (1,), generator=generator))
        start = lo + int(torch.randint(0, hi - lo - size + 1, (1,), generator=generator))
        units = tuple(Unit(i) for i in range(start, start + size))
        return Plan(units=units, trained=tuple(range(size)), info={"window": (start, start + size)})
