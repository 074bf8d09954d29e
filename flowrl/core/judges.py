"""Pairwise judges (the ``judge`` kind): a part that says which of two images better answers their prompt.

A judge is not a reward: a group-wise reward wraps one (``pairwise_win_rate``, whose ``[reward.judge]`` table names
it) and turns its verdicts on every pair of a group into one score per image. ``flowrl ls judge`` lists them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from torch import Tensor

from flowrl.core.interfaces import Component


class PairwiseJudge(Component, ABC):
    """Compares two images made for the same prompt: which one answers it better."""

    def check(self) -> None:
        """Fail early (before any model loads) when weights, extras or a server are missing."""

    @classmethod
    def needs_conditions(cls, config: Any) -> bool:
        """Whether the judge reads each prompt's condition images (an edit judge compares both results with the
        source); asked of the class and its config, as :meth:`flowrl.core.interfaces.RewardModel.needs_conditions`."""
        return False

    @abstractmethod
    def compare(self, first: Tensor, second: Tensor, prompts: list[str]) -> Tensor:
        """Verdicts ``(K,)`` in [0, 1] on ``K`` pairs: pair ``k`` is ``first[k]`` against ``second[k]`` (images
        ``(K, 3, H, W)`` in [0, 1]) for ``prompts[k]``; 1 where the first is better, 0 where the second is, 0.5
        for a tie (or an answer the judge could not give). A value in between is the first's share of the win
        (a judge's probability)."""
