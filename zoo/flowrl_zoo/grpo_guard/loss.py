"""GRPO-Guard's regulated clipping: the normalised ratio and the per-step reweighting of the PPO surrogate."""

from __future__ import annotations

from typing import Literal

import attrs
import torch
from torch import Tensor

from flowrl import register
from flowrl.core.types import LossInputs
from flowrl.parts.losses import PPOClip, gaussian_mean_kl


def normalised_log_ratio(log_ratio: Tensor, mean: Tensor, old_mean: Tensor, std: Tensor) -> Tensor:
    """``s (logp - logp_old + KL)`` with ``s`` the transition's std and ``KL = mean_dims (mean - old_mean)^2 / (2
    s^2)`` (:func:`flowrl.parts.losses.gaussian_mean_kl`, gradient through ``mean``):
    ``s log r + mean_dims d^2 / (2 s)``.

    For ``x' = old_mean + s eps`` the raw log-ratio is ``<eps, d> / s - mean_dims(d^2) / (2 s^2)`` (``d = mean -
    old_mean``, ``<.,.>`` the mean over dimensions): its second term shifts it below 0 by an amount that grows
    as ``1 / s^2`` at low noise. Adding that term back and multiplying by ``s`` leaves ``<eps, d>``: centred
    at 0 with a spread ``rms(d) / sqrt(D)`` that no longer depends on the noise level. The added term keeps
    its gradient (through ``mean``), so the gradient of the result with respect to the mean is ``eps / D``.
    """
    s = std.float()
    return s * (log_ratio.float() + gaussian_mean_kl(mean, old_mean, s))


@register("loss", "grpo_guard")
class GRPOGuardLoss(PPOClip):
    """PPO clip on the normalised ratio, each step's surrogate times 1 / |dt| (GRPO-Guard, arXiv 2510.22319).

    ``L = mean(w g(dt) max(-A r', -A clip(r', 1 - e, 1 + e))) + kl_beta mean(KL)`` where ``r' = exp(s (logp -
    logp_old) + mean_dims (mean - mean_old)^2 / (2 s)))`` (:func:`normalised_log_ratio`, ``ratio_norm``) and
    ``g(dt) = 1 / |dt|`` (``reweight = "inv_dt"``; ``"none"``: 1). At the rollout-time policy ``r' = 1`` and the
    gradient with respect to the mean is ``-A w eps / (D |dt|)``: with the Flow-GRPO kernel, whose mean moves
    with the velocity by ``(1 + a^2 / 2) dt``, every noise level then gets the same gradient per unit of
    velocity, where plain Flow-GRPO's grows as ``1 / sigma_t`` towards low noise. The KL term (the parent's,
    unweighted) is off by default, as in the paper. The clip range is much smaller than Flow-GRPO's: the
    normalised log-ratio's spread is ``rms(mean - mean_old) / sqrt(D)``.
    """

    @attrs.frozen
    class Config(PPOClip.Config):
        clip_range: float = attrs.field(default=2e-6, validator=attrs.validators.gt(0))  # e, on r'
        ratio_norm: bool = True  # false: the raw ratio (only the reweighting)
        reweight: Literal["inv_dt", "none"] = "inv_dt"  # g(dt): 1 / |dt|, or 1

    @property
    def needs_old_mean(self) -> bool:  # type: ignore[override]
        """The normalisation reads the rollout-time policy's means."""
        return bool(self.config.ratio_norm)

    def log_ratio(self, batch: LossInputs) -> Tensor:
        raw = super().log_ratio(batch)
        if not self.config.ratio_norm:
            return raw
        if batch.old_mean is None:
            raise ValueError("grpo_guard with ratio_norm needs the rollout-time means (LossInputs.old_mean)")
        return normalised_log_ratio(raw, batch.mean, batch.old_mean, batch.std)

    def step_weight(self, batch: LossInputs) -> Tensor:
        if self.config.reweight == "none":
            return super().step_weight(batch)
        if batch.dt is None:
            raise ValueError("grpo_guard's reweighting needs the transitions' dt (LossInputs.dt)")
        return 1.0 / batch.dt.detach().float().abs()

    def gradient_scale(self, std: Tensor, dt: Tensor) -> Tensor:
        """``s`` from the normalisation (the ratio's derivative in ``logp``) times ``1 / |dt|``."""
        scale = std.float() if self.config.ratio_norm else torch.ones_like(std.float())
        return scale / dt.float().abs() if self.config.reweight == "inv_dt" else scale
