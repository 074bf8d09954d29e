"""Diffusion-DPO on the forward process of flow matching: preferred against rejected image at shared noise."""

from __future__ import annotations

from typing import Literal

import attrs
import torch
import torch.nn.functional as F
from attrs.validators import ge, gt
from torch import Tensor

from flowrl import register
from flowrl.core.choices import one_of
from flowrl.core.interfaces import ForwardProcessLoss
from flowrl.core.types import ForwardProcessInputs
from flowrl_zoo.diffusion_dpo.pairs import PairMode, preference_rows
from flowrl_zoo.diffusion_dpo.times import TimeDistribution, pair_times

Reference = Literal["base", "lagged"]
SamplerPolicy = Literal["policy", "reference"]


def flow_errors(batch: ForwardProcessInputs, v_ref: Tensor) -> tuple[Tensor, Tensor]:
    """Per row, ``mean_dims (v - u)^2`` of the policy and of the reference, ``u = eps - x0 = (x_t - x0) / t`` the
    flow-matching target at the row's point (the reference's error is a constant: detached)."""
    shape = (-1, *([1] * (batch.x_t.dim() - 1)))
    x0, x_t, t = batch.x0.float(), batch.x_t.float(), batch.t.float().reshape(shape)
    target = (x_t - x0) / t
    err = (batch.v.float() - target).flatten(1).square().mean(1)
    err_ref = (v_ref.detach().float() - target).flatten(1).square().mean(1)
    return err, err_ref


def paired(batch: ForwardProcessInputs) -> tuple[Tensor, Tensor]:
    """The micro-batch's pairs as ``(chosen, rejected)`` row indices: rows ``2k, 2k + 1`` share a draw (both
    images of a pair re-noised alike, :meth:`DiffusionDPOLoss.rows`); the one with the higher advantage is the
    preferred. Pairs whose advantages are equal are left out."""
    n = int(batch.x0.shape[0])
    draw = batch.draw
    if draw is None or n % 2 or bool((draw[0::2] != draw[1::2]).any()):
        raise ValueError("diffusion_dpo needs rows in pairs that share a noise draw (ForwardProcessLoss.rows)")
    first, second = torch.arange(0, n, 2), torch.arange(1, n, 2)
    a = batch.advantages.detach().float().cpu()
    keep = a[first] != a[second]
    swap = a[second] > a[first]
    chosen = torch.where(swap, second, first)[keep]
    rejected = torch.where(swap, first, second)[keep]
    return chosen.to(batch.x0.device), rejected.to(batch.x0.device)


def dpo_loss(err: Tensor, err_ref: Tensor, chosen: Tensor, rejected: Tensor, beta: float) -> tuple[Tensor, Tensor]:
    """Per pair ``-log sigmoid(-(beta / 2) (D_w - D_l))`` with ``D = err - err_ref``, and the logit
    ``-(beta / 2) (D_w - D_l)`` (positive when the policy moved towards the preferred image more than the reference)."""
    gain = err - err_ref
    logit = -0.5 * beta * (gain[chosen] - gain[rejected])
    return -F.logsigmoid(logit), logit


@register("loss", "diffusion_dpo")
class DiffusionDPOLoss(ForwardProcessLoss):
    """Diffusion-DPO in the flow form (Wallace et al., arXiv 2311.12908; the flow form as in Flow-DPO, arXiv
    2501.13918): preferred and rejected image of a pair re-noised with one ``t`` and one ``eps``,
    ``x_t = (1 - t) x0 + t eps``, compared with the reference by their flow-matching errors.

    ``D(x0) = mean (v(x_t) - u)^2 - mean (v_ref(x_t) - u)^2`` with ``u = eps - x0``, and per pair
    ``L = -log sigmoid(-(beta / 2) (D(x0_w) - D(x0_l)))``, averaged over the pairs of the update. Pairs
    (``pairs``): the best against the worst rollout of each prompt, or every two rollouts of a prompt whose
    advantages differ; tied pairs are skipped. ``beta`` is for errors averaged over the latent's dimensions
    (100 in the flow-matching trainers; a summed error would need ``beta / dims``).

    The reference (``reference``): ``"base"``, the initial policy (LoRA switched off, or a frozen copy); or
    ``"lagged"``, a copy of the trained weights that is made anew every ``ref_update_every`` optimizer steps (0:
    never, the initial weights throughout), as Flow-GRPO's DPO script refreshes its reference adapter; with
    ``sampler_policy = "reference"`` that copy also samples the rollouts, as in that script. Noise levels
    (``timesteps``): logit-normal (``sigmoid(N(logit_mean, logit_std^2))``, the trainers' choice) or uniform, warped
    by ``time_shift``; ``levels = n`` trains each pair at ``n`` draws of ``(t, eps)`` in the one optimizer step.
    """

    @attrs.frozen
    class Config:
        beta: float = attrs.field(default=100.0, validator=gt(0))  # the preference's strength (mean-reduced errors)
        pairs: PairMode = attrs.field(default="best_worst", validator=one_of(PairMode))  # or "all" distinct pairs
        timesteps: TimeDistribution = attrs.field(default="logit_normal", validator=one_of(TimeDistribution))
        logit_mean: float = 0.0  # logit_normal: mean of the logit
        logit_std: float = attrs.field(default=1.0, validator=gt(0))  # logit_normal: std of the logit
        time_shift: float = attrs.field(default=1.0, validator=gt(0))  # t = k u / (1 + (k - 1) u); 1: unchanged
        reference: Reference = attrs.field(default="base", validator=one_of(Reference))  # or "lagged"
        ref_update_every: int = attrs.field(default=0, validator=ge(0))  # lagged: copy the weights every K steps
        # who samples the rollouts: the trained weights, or the lagged reference (Flow-GRPO's DPO script)
        sampler_policy: SamplerPolicy = attrs.field(default="policy", validator=one_of(SamplerPolicy))
        levels: int = attrs.field(default=1, validator=ge(1))  # draws of (t, eps) per pair and update

    @property
    def needs_reference(self) -> bool:  # type: ignore[override]
        """The base policy's velocity is needed unless the reference is the lagged copy."""
        return self.config.reference == "base"

    @staticmethod
    def check_config(config: DiffusionDPOLoss.Config) -> list[tuple[str, str]]:
        problems = []
        if config.ref_update_every > 0 and config.reference != "lagged":
            problems.append(("ref_update_every", 'refreshes the lagged reference; set reference = "lagged" (or 0)'))
        if config.sampler_policy == "reference" and config.reference != "lagged":
            problems.append(("sampler_policy", '"reference" samples with the lagged copy; set reference = "lagged"'))
        return problems

    def rows(self, advantages: Tensor, prompt: Tensor) -> tuple[Tensor, Tensor]:
        """The pairs (:func:`~flowrl_zoo.diffusion_dpo.pairs.preference_rows`), each pair one noise draw."""
        return preference_rows(advantages, prompt, self.config.pairs, self.config.levels)

    def sample_times(self, n: int, generator: torch.Generator) -> Tensor:
        c = self.config
        return pair_times(n, c.timesteps, c.logit_mean, c.logit_std, c.time_shift, generator)

    def lagged_decay(self, updates: int) -> float | None:
        """``"lagged"``: 0 (copy the weights) after every ``ref_update_every``-th step, else 1 (keep the copy)."""
        c = self.config
        if c.reference != "lagged":
            return None
        refresh = c.ref_update_every > 0 and updates > 0 and updates % c.ref_update_every == 0
        return 0.0 if refresh else 1.0

    def samples_from_lagged(self) -> bool:
        return self.config.sampler_policy == "reference"

    def forward_process(self, batch: ForwardProcessInputs) -> tuple[Tensor, dict[str, float]]:
        v_ref = batch.v_old if self.config.reference == "lagged" else batch.v_ref
        if v_ref is None:
            raise ValueError("diffusion_dpo with reference = 'base' needs the reference velocity (v_ref)")
        chosen, rejected = paired(batch)
        if chosen.numel() == 0:
            return batch.v.float().sum() * 0.0, {}
        err, err_ref = flow_errors(batch, v_ref)
        per, logit = dpo_loss(err, err_ref, chosen, rejected, self.config.beta)
        loss = per.mean()
        with torch.no_grad():
            stats = {
                "policy_loss": float(loss),
                "dpo/accuracy": float((logit > 0).float().mean()),  # pairs the policy already ranks right
                "dpo/logit": float(logit.mean()),
                "dpo/err_chosen": float(err[chosen].mean()),
                "dpo/err_rejected": float(err[rejected].mean()),
            }
        return loss, stats
