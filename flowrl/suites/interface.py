"""The suite interface: a prompt set, a pinned protocol, per-image scoring and the aggregation of the scores.

A suite is a registered part like a selector or a reward (``@register("suite", "name")``, an attrs ``Config``,
``package.module:Class`` from research code); ``flowrl ls suite`` lists them.
"""

from __future__ import annotations

import importlib
import json
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import attrs
import numpy as np
from torch import Tensor

from flowrl.core.errors import UserError
from flowrl.core.interfaces import Component
from flowrl.core.registry import add_kind
from flowrl.suites.protocol import Protocol


@attrs.frozen
class Item:
    """One prompt of a suite: its text, its category (a GenEval tag, an HPSv2 style; "" for none) and whatever
    the scorer needs of it (GenEval's objects, GenEval 2's questions), JSON-serialisable."""

    prompt: str
    category: str = ""
    meta: dict[str, Any] = attrs.field(factory=dict, hash=False)


class Suite(Component, ABC):
    """A benchmark: ``items()`` (the prompts), ``protocol()`` (how its images are made), ``score`` (figures per
    image) and ``aggregate`` (the table's figures)."""

    primary: str = "score"  # the figure a comparison's headline row shows
    lossless: ClassVar[bool] = False  # keep images as float arrays (.npy) instead of 8-bit PNGs
    source: ClassVar[str] = ""  # where the prompts and the scoring rules come from (docs and the table's note)
    scoring: ClassVar[tuple[str, ...]] = ()  # settings that choose the scorer, not the images (a detector's URL)
    fractions: ClassVar[tuple[str, ...]] = ()  # figures in [0, 1] by definition (partial credit): Wilson intervals

    @abstractmethod
    def protocol(self) -> Protocol:
        """The pinned protocol: a result made under another one is marked not comparable."""

    @abstractmethod
    def items(self) -> list[Item]:
        """The suite's prompts, in their fixed order (a :class:`flowrl.core.errors.UserError` when missing)."""

    @abstractmethod
    def score(self, images: Tensor, items: Sequence[Item]) -> list[dict[str, float]]:
        """Figures of each image ``(B, 3, H, W)`` in [0, 1] (a video base: clips ``(B, F, 3, H, W)``) for its item:
        one dict per image, the same keys for every image (keys starting with ``_`` are bookkeeping for
        :meth:`aggregate`, left out of comparisons)."""

    def check(self) -> None:
        """Raise a :class:`flowrl.core.errors.UserError` unless the suite can score (weights, extras, a server): one
        message naming everything missing, since it runs before generation."""

    def headline(self) -> dict[str, Any]:
        """The suite's headline figure as its source defines it: ``figure`` (its name), ``of`` (the per-image
        figure it is made of), ``by`` (``""``: the mean over prompts; ``"category"``: the mean over categories of
        each one's mean over prompts) and ``scale`` (the source's unit: 100 for a percentage)."""
        return {"figure": self.primary, "of": self.primary, "by": "", "scale": 1.0}

    def published_items(self) -> list[Item] | None:
        """The suite's published prompt set, read from its source (None: not here to read)."""
        from flowrl.suites.data import PromptSetError

        try:
            return type(self)(type(self).Config()).items()
        except PromptSetError:
            return None

    def prompt_source(self) -> str:
        """What this suite's prompts were read from (``run.json`` claims no more)."""
        own = getattr(self.config, "prompts", "")
        return f"the prompt file {own}" if own else self.source

    def scorer_problems(self, scoring: dict[str, Any]) -> list[str]:
        """Why the scorer settings ``scoring`` are not the suite's own (none when they are its defaults)."""
        defaults = attrs.asdict(type(self).Config())
        return [f"scored with {key} = {value!r}, not the suite's own" for key, value in scoring.items()
                if plain(value) != plain(defaults.get(key))]

    def aggregate(self, figures: Sequence[dict[str, float]], items: Sequence[Item]) -> dict[str, float]:
        """The table's figures from one figure dict per prompt (its images' mean): the mean of each figure over
        the prompts, and ``FIGURE/CATEGORY`` per category. Suites whose papers aggregate otherwise override it."""
        out: dict[str, float] = {}
        categories = sorted({item.category for item in items if item.category})
        for key in [k for k in figures[0] if not k.startswith("_")] if figures else []:
            values = np.asarray([f[key] for f in figures], dtype=np.float64)
            out[key] = finite_mean(values)
            for category in categories:
                chosen = np.asarray([item.category == category for item in items])
                out[f"{key}/{category}"] = finite_mean(values[chosen])
        return out


add_kind("suite", Suite)  # the registry imports no suite: the suites declare their kind


def named_function(spec: str, what: str) -> Any:
    """The function ``module:function`` names (a detector, a judge of your own); a :class:`UserError` naming
    ``what`` when it cannot be imported."""
    module, _, attr = spec.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as error:
        raise UserError(f"{what} '{spec}' cannot be imported ({error})") from None


def plain(value: Any) -> Any:
    """A setting as JSON has it (tuples and lists alike), to compare settings from TOML with defaults."""
    return json.loads(json.dumps(value, default=str))


def finite_mean(values: np.ndarray) -> float:
    """The mean (NaN for none)."""
    return float(values.mean()) if len(values) else math.nan
