"""A recipe's reward once built: what the loop, the evaluation and the profiles pass around."""

from __future__ import annotations

import attrs

from flowrl.core.interfaces import RewardModel


@attrs.frozen
class BuiltReward:
    """One ``[[reward]]`` table of a recipe, built: ``name`` keys its figures (``reward/<name>``,
    ``eval/<name>/...``), ``weight`` is its share of ``reward/total``, ``model`` scores the pictures."""

    name: str
    weight: float
    model: RewardModel
