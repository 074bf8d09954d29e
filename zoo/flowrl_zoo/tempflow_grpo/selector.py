"""TempFlow-GRPO's branch steps: an explicit list, or every k-th step."""

from __future__ import annotations

import attrs
import torch
from attrs.validators import ge

from flowrl import Plan, Schedule, TimestepSelector, Unit, register


def _as_steps(value: object) -> tuple[int, ...]:
    return tuple(int(v) for v in value)  # type: ignore[attr-defined]


def _check_steps(_instance: object, _attr: object, value: tuple[int, ...]) -> None:
    if any(v < 0 for v in value) or list(value) != sorted(set(value)):
        raise ValueError(f"steps must be distinct, increasing and >= 0, got {list(value)}")


@register("selector", "tempflow_steps")
class TempFlowSteps(TimestepSelector):
    """TempFlow-GRPO's branch steps: an explicit list or every k-th step, each a trained unit (arXiv 2508.04324).

    Each step is one SDE unit of merge 1, all trained. ``steps`` lists them explicitly; otherwise steps
    ``offset, offset + every, ...`` below
    ``N - 1`` (``N`` included with ``include_last``: a stochastic final step leaves noise in the image).
    """

    @attrs.frozen
    class Config:
        steps: tuple[int, ...] = attrs.field(default=(), converter=_as_steps, validator=_check_steps)  # explicit
        every: int = attrs.field(default=1, validator=ge(1))  # branch at every k-th step
        offset: int = attrs.field(default=0, validator=ge(0))  # first branch step
        include_last: bool = False  # allow branching at the final step N - 1

    @staticmethod
    def provides(config: Config) -> frozenset[str]:
        """A unit at every step (below the last) when ``every = 1`` without an explicit list."""
        return frozenset({"unit_every_step"}) if config.every == 1 and not config.steps else frozenset()

    @staticmethod
    def branch_steps(config: Config, num_steps: int) -> list[int]:
        if config.steps:
            return list(config.steps)
        stop = num_steps if config.include_last else num_steps - 1
        return list(range(config.offset, stop, config.every))

    @staticmethod
    def check_steps(config: Config, num_steps: int) -> list[tuple[str, str]]:
        if config.steps and config.steps[-1] >= num_steps:
            return [("steps", f"step {config.steps[-1]} is beyond the schedule's steps 0..{num_steps - 1}")]
        if not TempFlowSteps.branch_steps(config, num_steps):
            return [("offset", f"no branch step below {num_steps - 1} (lower offset or set include_last)")]
        return []

    def plan(self, schedule: Schedule, iteration: int, generator: torch.Generator) -> Plan:
        problems = self.check_steps(self.config, schedule.num_steps)
        if problems:
            raise ValueError(f"tempflow_steps: {problems[0][1]}")
        units = tuple(Unit(i) for i in self.branch_steps(self.config, schedule.num_steps))
        return Plan(units=units, trained=tuple(range(len(units))))
