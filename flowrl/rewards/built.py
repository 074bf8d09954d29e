"""A recipe's reward once built: what the loop, the evaluation and the profiles pass around."""

from __future__ import annotations

import attrs

from flowrl.config.reward_weights import WeightSchedule, weight_at
from flowrl.core.interfaces import RewardModel


@attrs.frozen
class BuiltReward:
    """One ``[[reward]]`` table of a recipe, built: ``name`` keys its figures (``reward/<name>``,
    ``eval/<name>/...``), ``weight`` is its share of ``reward/total``, ``model`` scores the pictures.

    ``schedule`` is the recipe's weight schedule where it gave one (None for a number); ``weight`` is then the
    schedule's value at the step the reward was built for (:meth:`at` gives the reward of another step)."""

    name: str
    weight: float
    model: RewardModel
    schedule: WeightSchedule | None = None

    def at(self, step: int) -> BuiltReward:
        """This reward with the weight of iteration ``step`` (itself where the weight is a number)."""
        if self.schedule is None:
            return self
        return attrs.evolve(self, weight=weight_at(self.schedule, step))
