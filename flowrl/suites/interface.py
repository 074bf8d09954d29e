"""The suite interface: a prompt set, a pinned protocol, per-image scoring and the aggregation of the scores.

A suite is a registered part like a selector or a reward (``@register("suite", "name")``, an attrs ``Config``,
``package.module:Class`` from research code); ``flowrl ls suite`` lists them.
"""

from __future__ import annotations

import importlib
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import attrs
import numpy as np
from torch import Tensor

from flowrl.errors import UserError
from flowrl.interfaces import Component
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

    @abstractmethod
    def protocol(self) -> Protocol:
        """The pinned protocol: a result made under another one is marked not comparable."""

    @abstractmethod
    def items(self) -> list[Item]:
        """The suite's prompts, in their fixed order (a :class:`flowrl.errors.UserError` when missing)."""

    @abstractmethod
    def score(self, images: Tensor, items: Sequence[Item]) -> list[dict[str, float]]:
        """Figures of each image ``(B, 3, H, W)`` in [0, 1] (a video base: clips ``(B, F, 3, H, W)``) for its item:
        one dict per image, the same keys for every image (keys starting with ``_`` are bookkeeping for
        :meth:`aggregate`, left out of comparisons)."""

    def check(self) -> None:
        """Raise a :class:`flowrl.errors.UserError` unless the suite can score (weights, extras, a server)."""

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


def named_function(spec: str, what: str) -> Any:
    """The function ``module:function`` names (a detector, a judge of your own); a :class:`UserError` naming
    ``what`` when it cannot be imported."""
    module, _, attr = spec.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as error:
        raise UserError(f"{what} '{spec}' cannot be imported ({error})") from None


def finite_mean(values: np.ndarray) -> float:
    """The mean (NaN for none)."""
    return float(values.mean()) if len(values) else math.nan
