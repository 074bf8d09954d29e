"""E-GRPO's multi-granularity advantages: each jump's reward measured after several ODE tails, normalised per
(prompt, unit) at each granularity, and summed per jump."""

from __future__ import annotations

from typing import Literal

import attrs
import torch
from attrs.validators import ge, in_
from torch import Tensor

from flowrl import AdvantageEstimator, Advantages, RewardBatch, Rollout, register
from flowrl.core.choices import one_of
from flowrl.core.contracts import needs
from flowrl.core.extras import PerRollout, RolloutIds
from flowrl.parts.advantages import group_normalize

Combine = Literal["sum", "mean"]  # over the K granularities
GRANULARITY = "granularity"  # Rollout.extras: (R,) long, which tail grid finished each image (0 .. K-1)
BRANCH = "branch"  # Rollout.extras: (R,) long ids, the jump (one trained transition) each image finishes


def _nonneg_or_none(_: object, attribute: attrs.Attribute, value: float | None) -> None:
    if value is not None and value < 0:
        raise ValueError(f"'{attribute.name}' must be >= 0 or None, got {value}")


def multi_granular(
    rewards: Tensor,
    group: Tensor,
    level: Tensor,
    branch: Tensor,
    *,
    eps: float = 1e-4,
    unbiased: bool = False,
    combine: str = "sum",
    clip: float | None = 5.0,
) -> Tensor:
    """``A_b = sum_k (r_{b,k} - mean_{g,k}) / (std_{g,k} + eps)`` for every image of jump ``b``, clipped to
    ``[-clip, clip]`` (``combine = "mean"``: divided by the number of granularities K).

    Image ``i`` finishes jump ``branch[i]`` with the tail of granularity ``level[i]``; ``(g, k)`` is the set of
    images of one (prompt, unit) group ``group[i]`` finished at one granularity: the G jumps of that unit, each
    seen once. Each such set is normalised on its own (:func:`flowrl.parts.advantages.group_normalize`, a constant set
    gives exact zeros), then a jump's K normalised values are summed, and every image of the jump carries the sum.
    Every jump must have exactly one image per granularity.
    """
    if not rewards.shape == group.shape == level.shape == branch.shape or rewards.dim() != 1:
        raise ValueError("rewards, groups, granularities and branches must all be (R,)")
    k = int(level.max()) + 1 if level.numel() else 1
    _, jump = torch.unique(branch, return_inverse=True)
    jumps = int(jump.max()) + 1 if jump.numel() else 0
    seen = torch.zeros(jumps, k, dtype=torch.long).index_put_((jump, level.long()), torch.ones_like(jump),
                                                             accumulate=True)
    if not bool((seen == 1).all()):
        raise ValueError("every jump (extras['branch']) needs one image per granularity (extras['granularity'])")
    _, g = torch.unique(group, return_inverse=True)
    per_image = group_normalize(rewards, g * k + level.long(), eps=eps, unbiased=unbiased, clip=None).double()
    total = torch.zeros(jumps, dtype=torch.float64).index_add_(0, jump, per_image)
    if combine == "mean":
        total = total / k
    values = total[jump]
    if clip:
        values = values.clamp(-clip, clip)
    return values.to(rewards.dtype)


@register("advantage", "egrpo_granular")
class MultiGranularAdvantage(AdvantageEstimator):
    """E-GRPO's multi-granularity advantages (arXiv 2601.00423): per (prompt, unit) at each tail granularity, summed.

    Needs the ``egrpo_granular`` sampler, which finishes every jump K times (ODE tails on grids of different
    strides) and marks each image's jump and granularity. For every (prompt, unit) group and granularity the G
    rewards are normalised, ``(r - mean) / (std + eps)``; a jump's advantage is the sum of its K normalised
    rewards (``combine = "mean"``: their mean), clipped to ``[-clip, clip]``, and trains its one transition. With
    one granularity it is ``group_norm`` per unit. ``multi_reward`` as in ``group_norm``.
    """

    provides = frozenset({"granular_advantages"})
    requires = (
        needs(
            "granular_rollouts",
            "it normalises each granularity's rewards per (prompt, unit) and sums them per jump; use the"
            " egrpo_granular sampler",
        ),
    )

    @attrs.frozen
    class Config:
        eps: float = attrs.field(default=1e-4, validator=ge(0))
        unbiased: bool = False  # Bessel-corrected std within a (prompt, unit, granularity) set
        combine: Combine = attrs.field(default="sum", validator=one_of(Combine))  # over K
        clip: float | None = attrs.field(default=5.0, validator=_nonneg_or_none)  # None or 0: no clip
        multi_reward: str = attrs.field(
            default="sum_then_normalize", validator=in_(("sum_then_normalize", "normalize_then_sum"))
        )

    def _advantages(self, values: Tensor, rollout: Rollout, clip: float | None) -> Tensor:
        level, branch = rollout.extras.get(GRANULARITY), rollout.extras.get(BRANCH)
        if not isinstance(level, PerRollout) or not isinstance(branch, RolloutIds):
            raise ValueError(
                "egrpo_granular needs each image's granularity and jump (Rollout.extras['granularity'] and"
                " ['branch']); use the 'egrpo_granular' sampler"
            )
        c = self.config
        return multi_granular(values, rollout.group, level.value, branch.value, eps=c.eps, unbiased=c.unbiased,
                              combine=c.combine, clip=clip)

    def __call__(self, rewards: RewardBatch, rollout: Rollout) -> Advantages:
        c = self.config
        per_reward = {k: self._advantages(v, rollout, None) for k, v in rewards.scores.items()}
        if c.multi_reward == "sum_then_normalize":
            values = self._advantages(rewards.total, rollout, c.clip)
        else:
            summed = sum(rewards.weights[k] * a for k, a in per_reward.items())
            assert isinstance(summed, Tensor), "a RewardBatch needs at least one score"
            values = summed.clamp(-c.clip, c.clip) if c.clip else summed
        return Advantages(values=values, per_reward=per_reward)
