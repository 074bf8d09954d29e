"""Policy losses on recorded transitions (docs/algorithms.md, loss)."""

from __future__ import annotations

import attrs
import torch
from torch import Tensor

from flowrl.core.interfaces import PolicyLoss
from flowrl.core.registry import register
from flowrl.core.types import LossInputs


def clipped_surrogate(log_ratio: Tensor, advantages: Tensor, clip_range: float) -> tuple[Tensor, Tensor]:
    """Per-transition ``max(-A r, -A clip(r, 1 - e, 1 + e))`` and ``r = exp(log_ratio)``; the advantages are
    constants (detached)."""
    advantages = advantages.detach()
    ratio = torch.exp(log_ratio)
    clipped = ratio.clamp(1.0 - clip_range, 1.0 + clip_range)
    return torch.maximum(-advantages * ratio, -advantages * clipped), ratio


def ppo_clip_objective(
    log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, clip_range: float
) -> tuple[Tensor, Tensor]:
    """:func:`clipped_surrogate` of ``r = exp(logp - logp_old)``; ``old_log_prob`` is a constant (detached)."""
    return clipped_surrogate(log_prob - old_log_prob.detach(), advantages, clip_range)


def gaussian_mean_kl(mean: Tensor, ref_mean: Tensor, std: Tensor) -> Tensor:
    """Per-transition ``mean_dims (mean - ref_mean)^2 / (2 std^2)``: KL of two Gaussians with one std (the
    reference is a constant: detached)."""
    sq = (mean.float() - ref_mean.detach().float()).square().flatten(1).mean(1)
    return sq / (2.0 * std.float().square())


@register("loss", "ppo_clip")
class PPOClip(PolicyLoss):
    """PPO clipped surrogate on per-transition density ratios, optional KL to the reference (GRPO family).

    ``L = mean(w max(-A r, -A clip(r, 1 - e, 1 + e))) + kl_beta mean(KL)`` (Flow-GRPO arXiv 2505.05470,
    Eq. 8; DanceGRPO, MixGRPO, E-GRPO). Two forms of the KL term, which differ by the factor ``-dt``:

    - ``kl_dt_factor = false`` (default): the exact KL of the two transition Gaussians,
      ``mean_dims (mean - ref_mean)^2 / (2 std^2)`` with the transition's std (for the SDE kernels
      ``std = sigma_t sqrt(-dt)``).
    - ``kl_dt_factor = true``: the official Flow-GRPO code's form, ``mean_dims (mean - ref_mean)^2 /
      (2 sigma_t^2)``, i.e. the exact KL times ``-dt = s - s_next`` (``LossInputs.dt``, filled by the
      trainer). On a 10-step grid with shift 3, ``-dt`` is 0.036 to 0.25, so the same ``kl_beta`` is 4 to 28
      times weaker than in the exact form. Betas taken from the official code (0.01 to 0.04) need this form;
      the paper recipes that set a KL use it.
    """

    @attrs.frozen
    class Config:
        clip_range: float = attrs.field(default=1e-4, validator=attrs.validators.gt(0))  # e
        kl_beta: float = attrs.field(default=0.0, validator=attrs.validators.ge(0))
        kl_dt_factor: bool = False

    @property
    def needs_reference(self) -> bool:  # type: ignore[override]
        """A reference (base-policy) mean is needed iff the KL term is on."""
        return bool(self.config.kl_beta > 0)

    def log_ratio(self, batch: LossInputs) -> Tensor:
        """The per-transition log-ratio the clip acts on: ``logp - logp_old`` (subclasses normalise it)."""
        return batch.log_prob - batch.old_log_prob.detach()

    def step_weight(self, batch: LossInputs) -> Tensor:
        """A per-transition factor of the surrogate beside ``LossInputs.weight`` (1 here; subclasses weight
        noise levels, and then declare :meth:`gradient_scale` to match)."""
        return torch.ones_like(batch.log_prob.detach())

    def surrogate(self, batch: LossInputs) -> tuple[Tensor, Tensor, Tensor]:
        """Per-transition surrogate, the ratio, and whether each transition is outside the trust region."""
        per, ratio = clipped_surrogate(self.log_ratio(batch), batch.advantages, self.config.clip_range)
        return per, ratio, (ratio.detach() - 1.0).abs() > self.config.clip_range

    def __call__(self, batch: LossInputs) -> tuple[Tensor, dict[str, float]]:
        per, ratio, outside = self.surrogate(batch)
        loss = (per * batch.weight * self.step_weight(batch)).mean()
        with torch.no_grad():
            diff = (batch.log_prob - batch.old_log_prob).float()
            stats = {
                "clip_frac": float(outside.float().mean()),
                "approx_kl": float(0.5 * diff.square().mean()),
                "ratio_mean": float(ratio.mean()),
                "policy_loss": float(loss.detach()),
            }
        if self.config.kl_beta > 0 and batch.ref_mean is not None:
            kl = gaussian_mean_kl(batch.mean, batch.ref_mean, batch.std)
            if self.config.kl_dt_factor:
                if batch.dt is None:
                    raise ValueError("kl_dt_factor needs the transitions' dt (LossInputs.dt)")
                kl = kl * (-batch.dt.float())
            kl_mean = kl.mean()
            loss = loss + self.config.kl_beta * kl_mean
            stats["kl"] = float(kl_mean.detach())
        return loss, stats
