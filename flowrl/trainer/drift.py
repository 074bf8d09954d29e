"""How far the policy has moved from the initial one, measured on the rollout's own transitions.

Reward hacking and collapse show as a policy that runs far from where it started while its evaluation stalls.
Every ``trainer.kl_every`` iterations (and after the last) the loop evaluates the current and the initial
(reference) policy on up to :data:`MAX_INPUTS` of the iteration's recorded transition inputs, with no extra
rollout and no gradient:

- ``health/kl_initial``: the KL divergence between the current and the initial policy's transition
  Gaussians, per latent dimension, averaged over the stochastic transitions that start from those inputs.
  Both Gaussians share the kernel's std, so it is ``mean_dims (mean - mean_initial)^2 / (2 std^2)``.
- ``health/velocity_drift``: ``rms(v - v_initial) / rms(v_initial)`` on the same inputs: the relative
  change of the predicted velocity, defined for every method (also where no transition is stochastic).

The initial policy is LoRA switched off, or a frozen copy of the initial transformer with full fine-tuning
(see ``flowrl.trainer.reference.install_reference``).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import torch

from flowrl.core.interfaces import Backbone, TransitionKernel
from flowrl.core.types import Conditioning, Schedule, Transitions
from flowrl.parts.losses import gaussian_mean_kl

MAX_INPUTS = 32  # transformer inputs evaluated twice (current, initial) per measurement


def spread_ids(count: int, limit: int) -> torch.Tensor:
    """Up to ``limit`` indices spread evenly over ``range(count)`` (every step of a rollout is represented)."""
    if count <= limit:
        return torch.arange(count)
    return torch.linspace(0, count - 1, limit).round().long().unique()


def policy_drift(
    backbone: Backbone,
    kernel: TransitionKernel,
    schedule: Schedule,
    cond: Conditioning,
    transitions: Transitions,
    reference: Callable[[], AbstractContextManager[None]],
    max_inputs: int = MAX_INPUTS,
) -> dict[str, float]:
    """``health/kl_initial`` (when some transition is stochastic) and ``health/velocity_drift``; ``{}``
    without transitions."""
    if len(transitions) == 0:
        return {}
    ids = spread_ids(transitions.num_inputs, max_inputs)
    device = transitions.inputs.device
    x = transitions.inputs[ids]
    s = transitions.input_s[ids]
    c = cond.take(transitions.input_cond[ids])
    with torch.no_grad():
        v = backbone.velocity(x, s, c).float()
        with reference():
            v_ref = backbone.velocity(x, s, c).float()
    out = {"health/velocity_drift": float(_rms(v - v_ref) / max(_rms(v_ref), 1e-12))}
    position = torch.full((transitions.num_inputs,), -1, dtype=torch.long)
    position[ids] = torch.arange(len(ids))
    local = position[transitions.input_index]
    chosen = (local >= 0).nonzero().flatten()
    if len(chosen) == 0:
        return out
    rows = local[chosen].to(device)
    s_next = transitions.s_next[chosen].to(device)
    x_rows, s_rows = x[rows].float(), s[rows]
    mean, std = kernel.mean_std(x_rows, v[rows], s_rows, s_next, schedule.s_at_one)
    ref_mean = kernel.mean_std(x_rows, v_ref[rows], s_rows, s_next, schedule.s_at_one)[0]
    stochastic = std > 0
    if bool(stochastic.any()):
        kl = gaussian_mean_kl(mean[stochastic], ref_mean[stochastic], std[stochastic])
        out["health/kl_initial"] = float(kl.mean())
    return out


def _rms(t: torch.Tensor) -> float:
    return float(t.square().mean().sqrt())
