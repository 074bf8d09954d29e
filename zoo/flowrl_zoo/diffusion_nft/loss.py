"""DiffusionNFT's objective on the forward process: implicit positive and negative policies."""

from __future__ import annotations

from typing import Literal

import attrs
import torch
from attrs.validators import ge, gt, le
from torch import Tensor

from flowrl import register
from flowrl.core.choices import one_of
from flowrl.core.interfaces import ForwardProcessLoss
from flowrl.core.types import ForwardProcessInputs

OldPolicy = Literal["rollout", "lagged"]
SamplerPolicy = Literal["policy", "old"]
MIN_WEIGHT = 1e-5  # floor of the adaptive weight (mean absolute error)


def adaptive_x0_loss(x0_hat: Tensor, x0: Tensor) -> Tensor:
    """Per-sample ``mean((x0_hat - x0)^2) / max(mean|x0_hat - x0|, 1e-5)``, the denominator detached."""
    err = (x0_hat - x0).flatten(1)
    scale = err.abs().mean(1).detach().clamp(min=MIN_WEIGHT)
    return err.square().mean(1) / scale


def optimality(advantages: Tensor, clip: float) -> Tensor:
    """``r = clamp(A / (2 c) + 0.5, 0, 1)`` with ``A`` clipped to ``[-c, c]``."""
    a = advantages.detach().float().clamp(-clip, clip)
    return (a / (2.0 * clip) + 0.5).clamp(0.0, 1.0)


def ramp_decay(updates: int, flat: int, rate: float, cap: float) -> float:
    """The lagged copy's decay after ``updates`` optimizer steps: 0 for the first ``flat`` steps, then growing by
    ``rate`` a step up to ``cap``: ``min(rate max(updates - flat, 0), cap)``."""
    return 0.0 if updates < flat else min(rate * (updates - flat), cap)


def stratified_levels(n: int, levels: int, shift: float, generator: torch.Generator) -> Tensor:
    """``n`` noise levels in consecutive blocks of ``levels`` rows (one block per rollout; a last block may be
    cut short): each block has one draw ``u`` in each of the ``levels`` equal bins of (0, 1), in random order,
    warped by the schedule's time shift ``t = s u / (1 + (s - 1) u)``, so one rollout's levels spread over the
    noise range the sampler visits."""
    blocks = -(-n // levels)
    bins = torch.argsort(torch.rand(blocks, levels, generator=generator), dim=1).float()  # a permutation per block
    u = ((bins + torch.rand(blocks, levels, generator=generator)) / levels).flatten()[:n]
    return (shift * u / (1.0 + (shift - 1.0) * u)).clamp(1e-3, 1 - 1e-3)


@register("loss", "diffusion_nft")
class DiffusionNFTLoss(ForwardProcessLoss):
    """Implicit positive/negative policies on re-noised rollouts, no log-densities (DiffusionNFT, arXiv 2509.16117).

    ``L = c mean(r L+ / beta + (1 - r) L- / beta) + kl_beta mean((v - v_ref)^2)`` on rollouts re-noised at
    ``x_t = (1 - t) x0 + t eps``.

    ``v+ = beta v + (1 - beta) v_old`` and ``v- = (1 + beta) v_old - beta v`` are the implicit positive and
    negative policies; ``x0+- = x_t - t v+-`` and ``L+-`` is :func:`adaptive_x0_loss` of ``x0+-``;
    ``r = clamp(A / (2 c) + 0.5, 0, 1)`` with ``c = adv_clip``. The leading factor is the same ``c``
    (``scale_by_clip``): the gradient at ``v = v_old`` is then ``c (2 r - 1) grad = A grad`` (for ``|A| <= c``),
    independent of the clip range.

    ``old_policy = "rollout"`` (default): ``v_old`` is the policy that sampled the rollouts. ``"lagged"``: a
    copy of the weights kept by the trainer, ``old <- d old + (1 - d) theta`` after each optimizer step, with
    ``d`` :func:`ramp_decay` of the steps taken (the official code's schedules: ``decay_flat = 0, decay_rate =
    0.001, decay_max = 0.5`` by default, ``75, 0.0075, 0.999`` for its OCR runs); with ``sampler_policy = "old"``
    the copy also samples the rollouts, as in the official code. ``levels = k``: each rollout is
    re-noised at ``k`` times per update (:func:`stratified_levels`, one in each of ``k`` bins of the shifted
    time axis), ``k`` loss rows per rollout averaged in one optimizer step.
    """

    @attrs.frozen
    class Config:
        beta: float = attrs.field(default=1.0, validator=gt(0))  # mixing strength of the implicit policies
        adv_clip: float = attrs.field(default=5.0, validator=gt(0))  # c: advantages clipped to [-c, c]
        scale_by_clip: bool = True  # multiply the policy loss by c (docs/algorithms.md); false: by 1
        kl_beta: float = attrs.field(default=0.0, validator=ge(0))  # weight of mean((v - v_ref)^2)
        old_policy: OldPolicy = attrs.field(
            default="rollout", validator=one_of(OldPolicy)
        )  # v_old: the sampling policy, or a lagged copy of the weights
        decay_flat: int = attrs.field(default=0, validator=ge(0))  # lagged: steps at decay 0 (the copy follows)
        decay_rate: float = attrs.field(default=0.001, validator=ge(0))  # lagged: decay growth per step after them
        decay_max: float = attrs.field(default=0.5, validator=[ge(0), le(1)])  # lagged: the decay's cap
        # who samples the rollouts: "policy" (the trained weights) or "old" (the lagged copy, as the official code)
        sampler_policy: SamplerPolicy = attrs.field(default="policy", validator=one_of(SamplerPolicy))
        levels: int = attrs.field(default=1, validator=ge(1))  # noise levels per rollout and update
        level_shift: float = attrs.field(default=1.0, validator=gt(0))  # time shift of the levels (1: uniform bins)

    @property
    def needs_reference(self) -> bool:  # type: ignore[override]
        """The reference policy's velocity is needed iff the KL term is on."""
        return bool(self.config.kl_beta > 0)

    def levels(self) -> int:
        return int(self.config.levels)

    def sample_times(self, n: int, generator: torch.Generator) -> Tensor:
        """Uniform levels for ``levels = 1`` and ``level_shift = 1`` (the default); else :func:`stratified_levels`."""
        c = self.config
        if c.levels == 1 and c.level_shift == 1.0:
            return super().sample_times(n, generator)
        return stratified_levels(n, c.levels, c.level_shift, generator)

    def lagged_decay(self, updates: int) -> float | None:
        c = self.config
        return ramp_decay(updates, c.decay_flat, c.decay_rate, c.decay_max) if c.old_policy == "lagged" else None

    def samples_from_lagged(self) -> bool:
        return self.config.sampler_policy == "old"

    @staticmethod
    def check_config(config: DiffusionNFTLoss.Config) -> list[tuple[str, str]]:
        if config.sampler_policy == "old" and config.old_policy != "lagged":
            return [("sampler_policy", "'old' samples with the lagged copy, which needs old_policy = \"lagged\"")]
        return []

    def forward_process(self, batch: ForwardProcessInputs) -> tuple[Tensor, dict[str, float]]:
        c = self.config
        shape = (-1, *([1] * (batch.x_t.dim() - 1)))
        t = batch.t.float().reshape(shape)
        x0, x_t = batch.x0.float(), batch.x_t.float()
        v, v_old = batch.v.float(), batch.v_old.float().detach()
        r = optimality(batch.advantages, c.adv_clip)
        v_pos = c.beta * v + (1.0 - c.beta) * v_old
        v_neg = (1.0 + c.beta) * v_old - c.beta * v
        loss_pos = adaptive_x0_loss(x_t - t * v_pos, x0)
        loss_neg = adaptive_x0_loss(x_t - t * v_neg, x0)
        per = (r * loss_pos + (1.0 - r) * loss_neg) / c.beta
        loss = (c.adv_clip if c.scale_by_clip else 1.0) * per.mean()
        stats = {
            "policy_loss": float(loss.detach()),
            "nft/r_mean": float(r.mean()),
            "nft/loss_pos": float(loss_pos.detach().mean()),
            "nft/loss_neg": float(loss_neg.detach().mean()),
        }
        if c.kl_beta > 0:
            if batch.v_ref is None:
                raise ValueError("diffusion_nft with kl_beta > 0 needs the reference velocity (v_ref)")
            kl = (v - batch.v_ref.detach().float()).square().mean()
            loss = loss + c.kl_beta * kl
            stats["kl"] = float(kl.detach())
        return loss, stats
