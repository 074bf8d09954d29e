"""A ``[[reward]]`` weight over training iterations: a number, or a schedule table (docs/recipes.md, "Reward weights
that change during training").

``weight = 0.5`` is a constant weight, as always. A table gives the weight of iteration ``k`` (0-based: the
iteration the loop runs after ``k`` finished ones) as a pure function of ``k``, so a resumed run uses the same
weights as an unbroken one::

    weight = { schedule = "linear", start = 0.0, end = 1.0, steps = 200, warmup = 0 }
    weight = { schedule = "cosine", start = 1.0, end = 0.2, steps = 500 }
    weight = { schedule = "step", start = 0.0, end = 1.0, at = 100 }
    weight = { schedule = "constant", start = 0.5 }

``linear`` and ``cosine`` hold ``start`` for ``warmup`` iterations, then move to ``end`` along a line or a half
cosine, reaching it at iteration ``steps`` and keeping it after (the shapes of the learning-rate decay,
:func:`flowrl.utils.lr_schedule.lr_factor`); ``step`` is ``start`` before iteration ``at`` and ``end`` from it on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

import attrs

from flowrl.core.choices import one_of
from flowrl.core.convert import ConfigError, structure
from flowrl.utils.lr_schedule import lr_factor

WeightShape = Literal["constant", "linear", "cosine", "step"]

# the keys each shape reads besides ``schedule`` and ``start``: (required, optional)
SHAPE_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "constant": ((), ()),
    "linear": (("end", "steps"), ("warmup",)),
    "cosine": (("end", "steps"), ("warmup",)),
    "step": (("end", "at"), ()),
}


def _optional_at_least(low: int) -> Any:
    return attrs.validators.optional(attrs.validators.ge(low))


@attrs.frozen
class WeightSchedule:
    """A reward weight that changes with the iteration (see the module's docstring for each shape)."""

    schedule: WeightShape = attrs.field(validator=one_of(WeightShape))
    start: float
    end: float | None = None
    steps: int | None = attrs.field(default=None, validator=_optional_at_least(1))
    warmup: int | None = attrs.field(default=None, validator=_optional_at_least(0))
    at: int | None = attrs.field(default=None, validator=_optional_at_least(0))

    def problems(self, path: str) -> list[tuple[str, str]]:
        """The keys this shape needs but lacks, or is given but does not read, each as ``(path.key, message)``."""
        required, optional = SHAPE_KEYS[self.schedule]
        found = []
        for key in ("end", "steps", "warmup", "at"):
            given = getattr(self, key) is not None
            if key in required and not given:
                found.append((f"{path}.{key}", f"missing required key (the '{self.schedule}' schedule needs it)"))
            elif given and key not in required + optional:
                found.append((f"{path}.{key}", f"not used by the '{self.schedule}' schedule; remove it"))
        if self.steps is not None and self.warmup is not None and self.warmup >= self.steps:
            found.append((f"{path}.warmup", f"must be below steps ({self.steps}), got {self.warmup}"))
        return found

    def to_table(self) -> dict[str, Any]:
        """The keys the recipe gave (the resolved recipe writes the table back as it was read)."""
        table = {f.name: getattr(self, f.name) for f in attrs.fields(WeightSchedule)}
        return {key: value for key, value in table.items() if value is not None}

    def describe(self) -> str:
        """A short phrase for a model card: ``linear 0 -> 1 by iteration 200``."""
        if self.schedule == "constant":
            return f"{self.start:g}"
        if self.schedule == "step":
            return f"{self.start:g}, {self.end:g} from iteration {self.at}"
        held = f" after {self.warmup}" if self.warmup else ""
        return f"{self.schedule} {self.start:g} -> {self.end:g}{held} by iteration {self.steps}"


Weight = float | WeightSchedule


def weight_at(weight: Weight, step: int) -> float:
    """The weight of iteration ``step`` (0-based). A number is itself at every step. ``linear``/``cosine``:
    ``end + (start - end) * f`` with ``f = lr_factor(max(0, step - warmup), 0, shape, steps - warmup, 0)``, which
    is 1 up to ``warmup`` and 0 from ``steps`` on, so ``start`` and ``end`` are exact there."""
    if not isinstance(weight, WeightSchedule):
        return float(weight)
    s = weight
    if s.schedule == "constant":
        return s.start
    assert s.end is not None, "a checked schedule has its end"
    if s.schedule == "step":
        assert s.at is not None
        return s.start if step < s.at else s.end
    assert s.steps is not None
    warmup = s.warmup or 0
    factor = lr_factor(max(0, step - warmup), 0, s.schedule, s.steps - warmup, 0.0)
    return s.end + (s.start - s.end) * factor


def parse_weight(value: Any, path: str, problems: list[tuple[str, str]]) -> Weight | None:
    """A recipe's ``weight`` (``path`` names it: ``reward[1].weight``): a finite number, or a schedule table; a
    problem is appended (key path, message) and None returned where it is neither."""
    if isinstance(value, Mapping):
        try:
            schedule = structure(WeightSchedule, value, path)
        except ConfigError as error:
            problems.extend(error.problems)
            return None
        found = schedule.problems(path)
        problems.extend(found)
        return None if found else schedule
    if isinstance(value, int | float) and not isinstance(value, bool):
        if math.isfinite(value):
            return float(value)
        problems.append((path, f"expected a finite number, got {value!r}"))
        return None
    problems.append((path, f"expected a finite number or a schedule table ({{ schedule = \"linear\", ... }}),"
                           f" got {value!r}"))
    return None


def scheduled(weight: Weight) -> WeightSchedule | None:
    """The schedule of a scheduled weight; None for a number."""
    return weight if isinstance(weight, WeightSchedule) else None


def weight_table(weight: Weight) -> float | dict[str, Any]:
    """The weight as the resolved recipe writes it: a number as a number, a schedule as its table."""
    return weight.to_table() if isinstance(weight, WeightSchedule) else weight


def describe_weight(weight: Weight) -> str:
    """A number as ``%g``, a schedule as :meth:`WeightSchedule.describe`."""
    return weight.describe() if isinstance(weight, WeightSchedule) else f"{weight:g}"
