"""Independent trajectories: every rollout follows its own path; SDE on the plan's units, ODE elsewhere."""

from __future__ import annotations

import attrs
import torch
from attrs.validators import ge
from torch import Tensor

from flowrl.core.interfaces import Backbone, RolloutSampler
from flowrl.core.registry import register
from flowrl.core.rng import RolloutRNG
from flowrl.core.types import Conditioning, Plan, Rollout, Schedule
from flowrl.parts.samplers.walk import TrajectoryRecorder, walk


@register("sampler", "independent")
class IndependentSampler(RolloutSampler):
    """G independent trajectories per prompt (Flow-GRPO, DanceGRPO); one transformer call per rollout per step."""

    chunkable = True  # each prompt's rollouts draw only its own noise: trainer.overlap_chunks may split the prompts

    @attrs.frozen
    class Config:
        group_size: int = attrs.field(default=8, validator=ge(1))  # rollouts per prompt (G)
        same_noise: bool = False  # one initial noise shared by a prompt's G rollouts (DanceGRPO)

    def rollout(
        self, backbone: Backbone, prompts: list[str], plan: Plan, schedule: Schedule, rng: RolloutRNG
    ) -> Rollout:
        sizes = torch.tensor(plan.sizes(len(prompts), self.config.group_size))
        nfe0 = backbone.nfe
        cond = backbone.encode(prompts)
        rollout_prompt = torch.arange(len(prompts)).repeat_interleave(sizes)
        if self.config.same_noise:
            x = rng.randn(torch.arange(len(prompts)), backbone.latent_shape, backbone.device)
            x = x.repeat_interleave(sizes.to(x.device), dim=0)
        else:
            x = rng.randn(rollout_prompt, backbone.latent_shape, backbone.device)
        recorder = TrajectoryRecorder(plan, rollout_index=torch.arange(len(rollout_prompt)))
        x = self.denoise(backbone, x, cond.take(rollout_prompt), rollout_prompt, plan, schedule, rng, recorder)
        return Rollout(
            prompts=list(prompts),
            cond=cond,
            images=backbone.decode(x),
            rollout_prompt=rollout_prompt,
            group=rollout_prompt.clone(),
            transitions=recorder.transitions(),
            nfe=backbone.nfe - nfe0,
            final_latents=x,
        )

    def denoise(
        self,
        backbone: Backbone,
        x: Tensor,
        cond: Conditioning,
        rollout_prompt: Tensor,
        plan: Plan,
        schedule: Schedule,
        rng: RolloutRNG,
        recorder: TrajectoryRecorder,
    ) -> Tensor:
        """Initial noise to final latents (one row per rollout): the plan's units as SDE steps, Euler ODE
        elsewhere. Subclasses change how the trajectory is integrated (MixGRPO-Flash's coarse tail)."""
        return walk(backbone, x, cond, rollout_prompt, 0, plan, schedule, rng, recorder)
