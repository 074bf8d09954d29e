"""Generic timestep selectors (method-specific ones live in the zoo)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs
import torch

from flowrl.core.errors import PartError, part_failure
from flowrl.core.interfaces import Backbone, TimestepSelector
from flowrl.core.registry import register
from flowrl.core.types import Plan, PlanError, Schedule, Unit


def observed_plan(
    selector: TimestepSelector, backbone: Backbone, prompts: list[str], schedule: Schedule, iteration: int,
    generator: torch.Generator, final_sde: bool, name: str,
) -> Plan:
    """The selector observes the iteration's prompts, then plans it (:func:`iteration_plan`); a hook that raises
    or exits is a :class:`PartError` naming the selector and the hook."""
    try:
        selector.observe(backbone, prompts, schedule)
    except (Exception, SystemExit) as error:
        raise PartError(f"selector {name!r} failed in observe() at iteration {iteration}: {part_failure(error)}") \
            from error
    return iteration_plan(selector, schedule, iteration, generator, final_sde, name)


def iteration_plan(
    selector: TimestepSelector, schedule: Schedule, iteration: int, generator: torch.Generator, final_sde: bool,
    name: str,
) -> Plan:
    """``selector``'s plan for one iteration, checked against the schedule (a :class:`PlanError` names the
    selector ``name``); unless ``final_sde`` (``[schedule] final_sde``), an untrained last unit ending at noise
    level 0 is dropped, so that step is the ODE step (:meth:`Plan.finish_by_ode`)."""
    try:
        plan = selector.plan(schedule, iteration, generator)
    except (Exception, SystemExit) as error:
        raise PartError(f"selector {name!r} failed in plan() at iteration {iteration}: {part_failure(error)}") \
            from error
    if not isinstance(plan, Plan):
        raise PartError(f"selector {name!r} returned a {type(plan).__name__} from plan() at iteration {iteration}; "
                        "plan() must return a flowrl.Plan")
    try:
        plan.check(schedule.num_steps)
    except PlanError as error:
        raise PlanError(f"selector {name!r} at iteration {iteration}: {error}") from None
    return plan if final_sde else plan.finish_by_ode(schedule.num_steps)


def as_units(value: Iterable[Iterable[int]]) -> tuple[tuple[int, int], ...]:
    """``[[start, merge], ...]`` as a tuple of int pairs."""
    return tuple((int(a), int(b)) for a, b in value)


def check_units(_instance: object, _attr: object, value: tuple[tuple[int, int], ...]) -> None:
    """Units must have start >= 0, merge >= 1, be ordered and not overlap."""
    for start, merge in value:
        if start < 0 or merge < 1:
            raise ValueError(f"unit [{start}, {merge}]: start must be >= 0 and merge >= 1")
    for (a, m), (b, _) in zip(value, value[1:], strict=False):
        if b < a + m:
            raise ValueError(f"units must be ordered and must not overlap: [{a}, {m}] then [{b}, ...]")


def merged_if(merges: bool) -> frozenset[str]:
    """A selector's ``provides``: the ``merged_units`` token when its plans may merge steps (flowrl.core.contracts)."""
    return frozenset({"merged_units"}) if merges else frozenset()


def units_field(default: tuple[tuple[int, int], ...]) -> Any:
    """An attrs field holding a unit list ``[[start, merge], ...]``, converted and checked."""
    return attrs.field(default=default, converter=as_units, validator=check_units)


def units_within(units: tuple[tuple[int, int], ...], num_steps: int) -> list[tuple[str, str]]:
    """A recipe problem when a unit runs past the schedule."""
    last = max((a + m for a, m in units), default=0)
    if last > num_steps:
        return [("units", f"unit ends at step {last}, beyond the schedule's {num_steps} steps")]
    return []


@register("selector", "explicit")
class ExplicitUnits(TimestepSelector):
    """A fixed list of SDE units [start, merge], all trained; every other step is ODE."""

    @attrs.frozen
    class Config:
        units: tuple[tuple[int, int], ...] = attrs.field(
            default=((0, 1),), converter=as_units, validator=[attrs.validators.min_len(1), check_units]
        )

    @staticmethod
    def provides(config: Config) -> frozenset[str]:
        return merged_if(any(m > 1 for _, m in config.units))

    @staticmethod
    def check_steps(config: Config, num_steps: int) -> list[tuple[str, str]]:
        return units_within(config.units, num_steps)

    def plan(self, schedule: Schedule, iteration: int, generator: torch.Generator) -> Plan:
        units = tuple(Unit(a, m) for a, m in self.config.units)
        return Plan(units=units, trained=tuple(range(len(units))))
