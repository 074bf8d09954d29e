"""E-GRPO's unit selection: merge consecutive low-entropy steps until the merged jump is entropic enough."""

from __future__ import annotations

import math

import attrs
import torch
from attrs.validators import ge, gt, le

from flowrl import Plan, Schedule, TimestepSelector, Unit, register
from flowrl.parts.entropy import merged_entropy
from flowrl.parts.selectors import merged_if, units_field, units_within


def greedy_units(schedule: Schedule, tau: float, end_by: int, max_merge: int) -> list[tuple[int, int]]:
    """E-GRPO's greedy rule: from step 0, the smallest merge whose entropy reaches ``tau``; stop at ``end_by``.

    A unit is kept only if it ends by step ``end_by``; the scan stops at the first step from which no
    merge (up to ``max_merge``, within the schedule) reaches ``tau``.
    """
    n = schedule.num_steps
    units, i = [], 0
    while i < n:
        merge = next(
            (m for m in range(1, min(max_merge, n - i) + 1) if merged_entropy(schedule, i, m) >= tau),
            None,
        )
        if merge is None or i + merge > end_by:
            break
        units.append((i, merge))
        i += merge
    return units


@register("selector", "egrpo_entropy")
class EntropyUnits(TimestepSelector):
    """E-GRPO units (start, merge): greedy merged-entropy rule with threshold tau and a step budget (arXiv 2601.00423).

    With N = 16, shift 3, Flow-GRPO kernel a = 0.7 and tau = 1.0 the rule gives (0,1), (1,1), (2,2), (4,3)
    within the default budget (units ending by step N/2), and (7,5) next without it.
    """

    @attrs.frozen
    class Config:
        tau: float = 1.0  # nats per dimension a unit's jump must reach
        budget: float = attrs.field(default=0.5, validator=[gt(0), le(1)])  # units must end by ceil(budget * N)
        max_merge: int = attrs.field(default=8, validator=ge(1))  # longest merge considered
        units: tuple[tuple[int, int], ...] = units_field(())  # explicit [[start, merge], ...] replace the rule

    @staticmethod
    def provides(config: Config) -> frozenset[str]:
        """Merged units, unless no merge is possible (``max_merge = 1``, or explicit units of one step each)."""
        if config.units:
            return merged_if(any(m > 1 for _, m in config.units))
        return merged_if(config.max_merge > 1)

    @staticmethod
    def check_steps(config: Config, num_steps: int) -> list[tuple[str, str]]:
        return units_within(config.units, num_steps)

    def plan(self, schedule: Schedule, iteration: int, generator: torch.Generator) -> Plan:
        c = self.config
        pairs = list(c.units) or greedy_units(schedule, c.tau, math.ceil(c.budget * schedule.num_steps), c.max_merge)
        if not pairs:
            raise ValueError(
                f"egrpo_entropy: no unit reaches tau = {c.tau} nats within the budget; lower tau or raise the budget"
            )
        units = tuple(Unit(a, m) for a, m in pairs)
        return Plan(units=units, trained=tuple(range(len(units))))
