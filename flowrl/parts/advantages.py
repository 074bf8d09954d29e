"""Group-normalised advantages (GRPO; docs/algorithms.md, advantages)."""

from __future__ import annotations

from typing import Literal

import attrs
import torch
from torch import Tensor

from flowrl.core.choices import one_of
from flowrl.core.interfaces import AdvantageEstimator
from flowrl.core.registry import register
from flowrl.core.types import Advantages, RewardBatch, Rollout


def group_normalize(
    rewards: Tensor,
    groups: Tensor,
    *,
    eps: float = 1e-4,
    unbiased: bool = False,
    global_std: bool = False,
    clip: float | None = 5.0,
) -> Tensor:
    """``A = (r - mean_g) / (std + eps)`` per group, clipped to ``[-clip, clip]`` (``None`` or 0: no clip).

    ``std`` is the group's std (biased or unbiased), or with ``global_std`` the std of all rewards in the
    batch (Flow-GRPO). A group whose rewards are all equal (a group of one included) gives exact zeros.
    Vectorised over groups; computed in float64 and returned in the rewards' dtype.
    """
    if rewards.shape != groups.shape or rewards.dim() != 1:
        raise ValueError(f"rewards {tuple(rewards.shape)} and groups {tuple(groups.shape)} must be (R,)")
    r = rewards.to(torch.float64)
    _, inv = torch.unique(groups.to(r.device), return_inverse=True)
    n_groups = int(inv.max()) + 1 if inv.numel() else 0
    count = torch.zeros(n_groups, dtype=r.dtype, device=r.device).index_add_(0, inv, torch.ones_like(r))
    total = torch.zeros_like(count).index_add_(0, inv, r)
    dev = r - (total / count)[inv]
    lo = torch.full_like(count, torch.inf).scatter_reduce(0, inv, r, "amin")
    hi = torch.full_like(count, -torch.inf).scatter_reduce(0, inv, r, "amax")
    dev = torch.where((lo == hi)[inv], torch.zeros_like(dev), dev)  # constant group: exact zeros
    if global_std:
        centred = r - r.mean()
        std = (centred.square().sum() / max(r.numel() - int(unbiased), 1)).sqrt()
    else:
        sq = torch.zeros_like(count).index_add_(0, inv, dev.square())
        std = (sq / (count - float(unbiased)).clamp(min=1.0)).sqrt()[inv]
    denom = std + eps
    adv = torch.where(denom > 0, dev / denom.clamp(min=torch.finfo(r.dtype).tiny), torch.zeros_like(dev))
    if clip:
        adv = adv.clamp(-clip, clip)
    return adv.to(rewards.dtype)


def batch_whiten(values: Tensor, *, eps: float = 1e-4, unbiased: bool = False) -> Tensor:
    """``(v - mean) / (std + eps)`` over the whole batch, in float64, returned in the values' dtype; a constant
    batch (one value included) gives exact zeros."""
    v = values.to(torch.float64)
    if v.numel() == 0 or bool(v.min() == v.max()):
        return torch.zeros_like(values)
    centred = v - v.mean()
    std = (centred.square().sum() / max(v.numel() - int(unbiased), 1)).sqrt()
    return (centred / (std + eps)).to(values.dtype)


MultiReward = Literal["sum_then_normalize", "normalize_then_sum", "gdpo"]


def _nonneg_or_none(_: object, attribute: attrs.Attribute, value: float | None) -> None:
    if value is not None and value < 0:
        raise ValueError(f"'{attribute.name}' must be >= 0 or None, got {value}")


@register("advantage", "group_norm")
class GroupNorm(AdvantageEstimator):
    """GRPO group normalisation within ``rollout.group``, clipped (Flow-GRPO / DanceGRPO / MixGRPO).

    ``sum_then_normalize`` normalises the weighted sum of the rewards (Flow-GRPO);
    ``normalize_then_sum`` normalises each reward within its group and takes the weighted sum (MixGRPO,
    E-GRPO multi-reward), clipping the sum once; ``gdpo`` (GDPO) normalises each reward within its group, takes
    the weighted sum, whitens that sum over the whole batch (the rewards of every process: ``(s - mean) / (std +
    eps)``, the std as ``unbiased`` says) and clips it once. In every mode each reward's normalised advantage
    (unclipped) is logged in ``per_reward``.
    """

    @attrs.frozen
    class Config:
        eps: float = attrs.field(default=1e-4, validator=attrs.validators.ge(0))
        unbiased: bool = False  # Bessel-corrected std (DanceGRPO)
        global_std: bool = False  # std over the whole batch (Flow-GRPO's default)
        clip: float | None = attrs.field(default=5.0, validator=_nonneg_or_none)  # None or 0: no clip
        multi_reward: MultiReward = attrs.field(default="sum_then_normalize", validator=one_of(MultiReward))

    def _normalize(self, values: Tensor, groups: Tensor, clip: float | None) -> Tensor:
        c = self.config
        return group_normalize(
            values, groups, eps=c.eps, unbiased=c.unbiased, global_std=c.global_std, clip=clip
        )

    def __call__(self, rewards: RewardBatch, rollout: Rollout) -> Advantages:
        groups = rollout.group
        per_reward = {k: self._normalize(v, groups, None) for k, v in rewards.scores.items()}
        c = self.config
        if c.multi_reward == "sum_then_normalize":
            values = self._normalize(rewards.total, groups, c.clip)
        else:
            summed = sum(rewards.weights[k] * a for k, a in per_reward.items())
            assert isinstance(summed, Tensor), "a RewardBatch needs at least one score"
            if c.multi_reward == "gdpo":
                summed = batch_whiten(summed, eps=c.eps, unbiased=c.unbiased)
            values = summed.clamp(-c.clip, c.clip) if c.clip else summed
        return Advantages(values=values, per_reward=per_reward)
