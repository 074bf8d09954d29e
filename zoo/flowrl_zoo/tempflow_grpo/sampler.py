"""TempFlow-GRPO's per-step branching: the shared-anchor sampler with single-step units and noise-aware weights."""

from __future__ import annotations

import attrs
import torch
from attrs.validators import ge

from flowrl import Backbone, Plan, Rollout, Schedule, register
from flowrl.core.contracts import refuses
from flowrl.core.rng import RolloutRNG
from flowrl.parts.samplers.anchor_branch import AnchorBranchSampler


def step_std(schedule: Schedule, steps: list[int]) -> torch.Tensor:
    """The kernel's std ``std_t = sigma_t sqrt(-dt)`` of one step from each grid step in ``steps``."""
    sig = schedule.tensor()
    index = torch.tensor(steps, dtype=torch.long)
    return schedule.kernel.std_only(sig[index], sig[index + 1], schedule.s_at_one).float()


@register("sampler", "tempflow_branch")
class TempFlowBranchSampler(AnchorBranchSampler):
    """Per-step branching from an ODE main path with noise-aware step weights (TempFlow-GRPO, arXiv 2508.04324).

    At each trained step t, G stochastic one-step branches leave the same x_t, each finished by ODE.

    Sampling is :class:`AnchorBranchSampler` with units of merge 1 (groups are (prompt, step) pairs). With
    ``noise_weighting`` every transition of step t gets the loss weight ``w_t = c std_t``; ``c =
    weight_scale``, or with ``weight_scale = 0`` the ``c`` that makes the mean of ``w_t`` over the trained
    steps 1.
    """

    requires = (refuses("merged_units", "it branches single steps; use the anchor_branch sampler for merged units"),)

    @attrs.frozen
    class Config(AnchorBranchSampler.Config):
        noise_weighting: bool = True  # weight each step's loss by c std_t
        weight_scale: float = attrs.field(default=0.0, validator=ge(0))  # c; 0: mean weight 1 over the steps

    def rollout(
        self, backbone: Backbone, prompts: list[str], plan: Plan, schedule: Schedule, rng: RolloutRNG
    ) -> Rollout:
        merged = [plan.units[k] for k in plan.trained if plan.units[k].merge != 1]
        if merged:
            raise ValueError(
                f"tempflow_branch branches single steps; unit ({merged[0].start}, {merged[0].merge}) merges steps "
                "(use the anchor_branch sampler for merged units)"
            )
        rollout = super().rollout(backbone, prompts, plan, schedule, rng)
        if self.config.noise_weighting and plan.trained:
            weights = self.step_weights(schedule, [plan.units[k].start for k in plan.trained])
            lookup = torch.zeros(len(plan.units))
            lookup[torch.tensor(plan.trained)] = weights
            t = rollout.transitions
            t.weight = lookup[t.unit_index].to(t.weight)
        return rollout

    def step_weights(self, schedule: Schedule, steps: list[int]) -> torch.Tensor:
        """``w_t = c std_t`` for each step (``c`` from ``weight_scale`` or normalised to mean 1)."""
        std = step_std(schedule, steps)
        if self.config.weight_scale > 0:
            return self.config.weight_scale * std
        if float(std.mean()) <= 0:
            raise ValueError("noise-aware weighting needs a stochastic kernel (every branch step has std 0)")
        return std / std.mean()
