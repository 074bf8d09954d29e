"""BranchGRPO's split steps and depth pruning, as a plan."""

from __future__ import annotations

from typing import Any

import attrs
import torch

from flowrl import Plan, Schedule, TimestepSelector, Unit, register
from flowrl.parts.selectors import units_within


def _ints(value: Any) -> tuple[int, ...]:
    return tuple(int(v) for v in value)


def _check_splits(_instance: object, _attr: object, value: tuple[int, ...]) -> None:
    if not value:
        raise ValueError("at least one split step is needed")
    if value[0] < 0 or any(b <= a for a, b in zip(value, value[1:], strict=False)):
        raise ValueError(f"split steps must be >= 0 and strictly increasing, got {list(value)}")


@register("selector", "branch_splits")
class BranchSplits(TimestepSelector):
    """BranchGRPO split steps (arXiv 2509.06040): each split is a one-step SDE unit where the tree branches.

    Split ``d`` (1-based, in step order) creates the nodes of depth ``d``; ``prune_depths`` lists depths whose
    edges are not trained (depth pruning: the unit is still sampled, its transitions are not recorded).
    """

    @attrs.frozen
    class Config:
        splits: tuple[int, ...] = attrs.field(default=(0, 3, 6, 9), converter=_ints, validator=_check_splits)
        prune_depths: tuple[int, ...] = attrs.field(default=(), converter=_ints)

        def __attrs_post_init__(self) -> None:
            bad = [d for d in self.prune_depths if not 1 <= d <= len(self.splits)]
            if bad:
                raise ValueError(f"prune_depths {bad} out of range: depths are 1..{len(self.splits)} (one per split)")
            if len(set(self.prune_depths)) == len(self.splits):
                raise ValueError("prune_depths prunes every depth: nothing would be trained")

    @staticmethod
    def check_steps(config: Config, num_steps: int) -> list[tuple[str, str]]:
        problems = units_within(tuple((s, 1) for s in config.splits), num_steps)
        return [("splits", msg.replace("unit ends", "a split ends")) for _, msg in problems]

    def plan(self, schedule: Schedule, iteration: int, generator: torch.Generator) -> Plan:
        units = tuple(Unit(s, 1) for s in self.config.splits)
        trained = tuple(k for k in range(len(units)) if k + 1 not in self.config.prune_depths)
        return Plan(units=units, trained=trained)
