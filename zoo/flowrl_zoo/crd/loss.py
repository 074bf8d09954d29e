"""Centered Reward Distillation's objective: the implicit reward of the policy against a lagged copy of
itself, centred within each prompt, regressed onto the prompt-centred external reward."""

from __future__ import annotations

import attrs
import torch
from attrs.validators import ge, gt, le
from torch import Tensor

from flowrl import register
from flowrl.core.interfaces import ForwardProcessLoss
from flowrl.core.types import ForwardProcessInputs
from flowrl_zoo.diffusion_nft.loss import adaptive_x0_loss


def adaptive_velocity_error(v: Tensor, target: Tensor) -> Tensor:
    """Per-sample ``mean((v - target)^2) / max(mean|v - target|, 1e-5)``, the normaliser a constant: DiffusionNFT's
    self-normalised error (:func:`~flowrl_zoo.diffusion_nft.loss.adaptive_x0_loss`), here in velocity space."""
    return adaptive_x0_loss(v.float(), target.float())


def group_centred(values: Tensor, group: Tensor) -> Tensor:
    """``values`` minus the mean of its prompt group (rows with equal ``group``); the mean is a constant."""
    ids, inverse = torch.unique(group, return_inverse=True)
    sums = torch.zeros(len(ids), dtype=values.dtype, device=values.device).index_add(0, inverse, values.detach())
    counts = torch.bincount(inverse, minlength=len(ids)).to(values.dtype)
    return values - (sums / counts)[inverse]


@register("loss", "crd")
class CRDLoss(ForwardProcessLoss):
    """Centred implicit reward regressed onto the centred reward, against a lagged policy (CRD, arXiv 2603.14128).

    KL-regularised reward maximisation has the optimum ``p* = p_old exp(r / beta) / Z(c)``, so ``beta log(p* /
    p_old) = r - beta log Z(c)``: ``Z`` is intractable but the same for every image of a prompt, and cancels once
    both sides are centred within the prompt. On a rollout re-noised at ``x_t = (1 - t) x0 + t eps`` (target
    velocity ``u = eps - x0``) the log-ratio is estimated by the difference of denoising errors,
    ``l = e(v_old) - e(v)`` with ``e`` :func:`adaptive_velocity_error`, and the loss is

    ``L = (c / beta) mean((beta l^c - a^c)^2) + mean(k_i mean_dims (v - v_ref)^2)``

    with ``l^c`` centred within the prompt (:func:`group_centred`, the mean a constant), ``a^c = clip(A, -c, c) /
    (2 c)`` (the advantages are already centred within the prompt by the estimator: this is the centred
    reward mapped to [-1/2, 1/2]) and ``c = adv_clip``. ``v_old`` is a lagged copy of the policy (``old <- d old
    + (1 - d) theta`` after each optimizer step, ``d = min(decay_start + decay_slope k, decay_max)`` at step
    ``k``: the ratio has time to grow before the reference catches up). The KL anchor to the base model has
    the reward-adaptive weight ``k_i = kl_min + (kl_beta - kl_min) a_i``, ``a_i = a^c_i + 1/2`` (off with
    ``kl_beta = 0``; ``reward_adaptive = false``: ``k_i = kl_beta``).
    """

    @attrs.frozen
    class Config:
        beta: float = attrs.field(default=1.0, validator=gt(0))  # KL strength of the target p* (per prompt)
        adv_clip: float = attrs.field(default=5.0, validator=gt(0))  # c: advantages clipped to [-c, c]
        decay_start: float = attrs.field(default=0.25, validator=[ge(0), le(1)])  # the lagged copy's decay at step 0
        decay_slope: float = attrs.field(default=0.005, validator=ge(0))  # its growth per optimizer step
        decay_max: float = attrs.field(default=0.999, validator=[ge(0), le(1)])  # and its cap
        kl_beta: float = attrs.field(default=0.0, validator=ge(0))  # anchor to the base model, mean((v - v_ref)^2)
        kl_min: float = attrs.field(default=1e-4, validator=ge(0))  # the adaptive weight at the lowest reward
        reward_adaptive: bool = True  # the anchor's weight grows with the reward (k_i above)

    @staticmethod
    def check_config(config: CRDLoss.Config) -> list[tuple[str, str]]:
        if config.kl_beta > 0 and config.reward_adaptive and config.kl_min > config.kl_beta:
            return [("kl_min", f"{config.kl_min} exceeds kl_beta = {config.kl_beta}: the adaptive weight would fall "
                               "as the reward grows")]
        return []

    @property
    def needs_reference(self) -> bool:  # type: ignore[override]
        """The base model's velocity is needed iff the anchor is on."""
        return bool(self.config.kl_beta > 0)

    def lagged_decay(self, updates: int) -> float:
        c = self.config
        return min(c.decay_start + c.decay_slope * updates, c.decay_max)

    def forward_process(self, batch: ForwardProcessInputs) -> tuple[Tensor, dict[str, float]]:
        c = self.config
        shape = (-1, *([1] * (batch.x_t.dim() - 1)))
        t = batch.t.float().reshape(shape)
        target = (batch.x_t.float() - batch.x0.float()) / t  # eps - x0
        v, v_old = batch.v.float(), batch.v_old.float().detach()
        implicit = adaptive_velocity_error(v_old, target) - adaptive_velocity_error(v, target)
        group = batch.group if batch.group is not None else torch.zeros(len(implicit), dtype=torch.long)
        centred = group_centred(implicit, group.to(implicit.device))
        a = batch.advantages.detach().float().clamp(-c.adv_clip, c.adv_clip) / (2.0 * c.adv_clip)
        loss = (c.adv_clip / c.beta) * (c.beta * centred - a).square().mean()
        stats = {
            "policy_loss": float(loss.detach()),
            "crd/implicit_abs": float(implicit.detach().abs().mean()),
            "crd/fit_corr": _correlation(centred.detach(), a),
        }
        if c.kl_beta > 0:
            if batch.v_ref is None:
                raise ValueError("crd with kl_beta > 0 needs the reference velocity (v_ref)")
            flat = torch.full_like(a, c.kl_beta)
            weight = c.kl_min + (c.kl_beta - c.kl_min) * (a + 0.5) if c.reward_adaptive else flat
            kl = (v - batch.v_ref.detach().float()).square().flatten(1).mean(1)
            loss = loss + (weight * kl).mean()
            stats["kl"] = float(kl.detach().mean())
        return loss, stats


def _correlation(x: Tensor, y: Tensor) -> float:
    """Pearson correlation of two vectors (0 when either is constant): how well the implicit reward fits."""
    x, y = x - x.mean(), y - y.mean()
    denom = float(x.norm() * y.norm())
    return float((x * y).sum()) / denom if denom > 0 else 0.0
