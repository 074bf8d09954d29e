"""Flow-DPPO's objective: the unclipped ratio surrogate, masked where a transition left its divergence trust
region in the direction its advantage pushes."""

from __future__ import annotations

import attrs
import torch
from attrs.validators import ge, gt
from torch import Tensor

from flowrl import register
from flowrl.core.types import LossInputs
from flowrl.parts.losses import PPOClip, gaussian_mean_kl


def mean_kl(mean: Tensor, old_mean: Tensor, std: Tensor) -> Tensor:
    """Per-transition ``KL(old || new)`` of two Gaussians with one std, divided by the dimension:
    ``mean_dims (mean - old_mean)^2 / (2 std^2)`` (:func:`flowrl.parts.losses.gaussian_mean_kl`), a constant here."""
    return gaussian_mean_kl(mean.detach(), old_mean, std.detach())


def outside_trust_region(kl: Tensor, ratio: Tensor, advantages: Tensor, threshold: float) -> Tensor:
    """Masked transitions: ``kl >= threshold`` and moving further the way the advantage pushes (``A > 0`` with
    ``r > 1``, or ``A < 0`` with ``r < 1``); a move back towards the old policy always passes."""
    ratio, advantages = ratio.detach(), advantages.detach()
    further = ((advantages > 0) & (ratio > 1)) | ((advantages < 0) & (ratio < 1))
    return (kl >= threshold) & further


@register("loss", "flow_dppo")
class FlowDPPOLoss(PPOClip):
    """Divergence-masked PPO on per-transition ratios, no ratio clip (Flow-DPPO, arXiv 2606.11025; DPPO 2602.04879).

    ``L = mean(w where(masked, 0, -A r)) + kl_beta mean(KL_ref)``, ``r = exp(logp - logp_old)``; a transition is
    masked when its exact divergence from the rollout-time policy, :func:`mean_kl` (the two steps are Gaussians
    with one std, so the KL is closed-form), reaches ``threshold`` while the ratio moves the way its advantage
    pushes (:func:`outside_trust_region`). The mask is a constant (no gradient through the KL); the mean counts
    the masked transitions. Unlike a ratio clip, which tests one sample of the ratio (biased below 1 for
    Gaussians: ``E[log r] = -KL``), the test is on the divergence itself.
    """

    @attrs.frozen
    class Config:  # no clip range: the mask replaces the clip (the masked share is logged as clip_frac)
        threshold: float = attrs.field(default=1e-5, validator=gt(0))  # tau, on mean_dims KL (per dimension)
        kl_beta: float = attrs.field(default=0.0, validator=ge(0))  # the parent's KL to the reference
        kl_dt_factor: bool = False

    needs_old_mean = True

    def surrogate(self, batch: LossInputs) -> tuple[Tensor, Tensor, Tensor]:
        if batch.old_mean is None:
            raise ValueError("flow_dppo needs the rollout-time means (LossInputs.old_mean)")
        ratio = torch.exp(self.log_ratio(batch))
        kl = mean_kl(batch.mean, batch.old_mean, batch.std)
        masked = outside_trust_region(kl, ratio, batch.advantages, self.config.threshold)
        per = torch.where(masked, torch.zeros_like(ratio), -batch.advantages.detach() * ratio)
        return per, ratio, masked
