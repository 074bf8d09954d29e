"""Generic timestep selectors (method-specific ones live in the zoo)."""

from __future__ import annotations

from collections.abc import Iterable

import attrs
import torch

from flowrl.interfaces import TimestepSelector
from flowrl.registry import register
from flowrl.types import Plan, Schedule, Unit


def _units_converter(value: Iterable[Iterable[int]]) -> tuple[tuple[int, int], ...]:
    return tuple((int(a), int(b)) for a, b in value)


@register("selector", "explicit")
class ExplicitUnits(TimestepSelector):
    """A fixed list of SDE units [start, merge], all trained; every other step is ODE."""

    @attrs.frozen
    class Config:
        units: tuple[tuple[int, int], ...] = attrs.field(default=((0, 1),), converter=_units_converter)

        @units.validator
        def _check(self, _attr: object, value: tuple[tuple[int, int], ...]) -> None:
            if not value:
                raise ValueError("needs at least one unit [start, merge]")
            for start, merge in value:
                if start < 0 or merge < 1:
                    raise ValueError(f"unit [{start}, {merge}]: start must be >= 0 and merge >= 1")
            for (a, m), (b, _) in zip(value, value[1:], strict=False):
                if b < a + m:
                    raise ValueError(f"units must be ordered and must not overlap: [{a}, {m}] then [{b}, ...]")

    @staticmethod
    def check_steps(config: Config, num_steps: int) -> list[tuple[str, str]]:
        last = max(a + m for a, m in config.units)
        if last > num_steps:
            return [("units", f"unit ends at step {last}, beyond the schedule's {num_steps} steps")]
        return []

    def plan(self, schedule: Schedule, iteration: int, generator: torch.Generator) -> Plan:
        units = tuple(Unit(a, m) for a, m in self.config.units)
        return Plan(units=units, trained=tuple(range(len(units))))
