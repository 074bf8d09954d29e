"""Flash-GRPO's iso-temporal rollouts: each prompt's group takes one SDE step, at a step drawn for the prompt."""

from __future__ import annotations

import attrs
import torch
from attrs.validators import ge
from torch import Tensor

from flowrl import Backbone, Plan, Rollout, RolloutSampler, Schedule, register
from flowrl.core.contracts import refuses
from flowrl.core.extras import PerRollout
from flowrl.core.rng import RolloutRNG
from flowrl.core.types import Conditioning, Transitions
from flowrl.parts.samplers.solvers import euler_step
from flowrl.parts.samplers.untrained import untrained_forwards
from flowrl.parts.samplers.walk import empty_transitions
from flowrl_zoo.flash_grpo.rectification import rectification_weights


def candidate_pool(plan: Plan) -> list[int]:
    """The units a prompt may draw its SDE step from (indices into ``plan.units``): the trained ones, each of
    merge 1 (a ValueError names a merged one). The plan's untrained units are ODE steps here."""
    for k in plan.trained:
        unit = plan.units[k]
        if unit.merge != 1:
            raise ValueError(f"iso_temporal takes single steps; unit ({unit.start}, {unit.merge}) merges steps")
    return sorted(plan.trained)


@register("sampler", "iso_temporal")
class IsoTemporalSampler(RolloutSampler):
    """One SDE step per rollout, at a step shared by the prompt's group (Flash-GRPO, arXiv 2605.15980).

    For each prompt a unit ``k`` is drawn uniformly from the plan's trained units (the candidate pool, e.g.
    ``flash_window``'s) with the prompt's own generator: prompts of one batch get different ``k``, and the draw
    does not depend on how the prompts are split over processes. The prompt's ``G`` rollouts start from
    independent noise and take every step by Euler ODE except step ``k``, where they take the kernel's SDE step;
    that one transition per rollout is trained, and the group is the prompt (*iso-temporal grouping*: the
    rewards of a group differ by the policy's draws, not by which step explored). The plan's untrained units are
    ODE steps here. ``Rollout.extras["sde_step"]`` holds each rollout's ``k``.

    With ``rectification`` (temporal gradient rectification) the transition's loss weight is
    ``w_k = (1 / c_k) / mean_pool(1 / c)``, ``c_k`` the kernel's policy-gradient scale ``|b| / std`` at step
    ``k`` (:mod:`flowrl_zoo.flash_grpo.rectification`); the weights average 1 over the pool.

    Cost: ``N`` evaluations per rollout, as Flow-GRPO; the forwards of the ODE steps are marked untrained.
    """

    chunkable = True  # a prompt's step k and noise come from its own generator: trainer.overlap_chunks may split
    requires = (refuses("merged_units", "it takes single SDE steps; use a selector without merged units"),)

    @attrs.frozen
    class Config:
        group_size: int = attrs.field(default=8, validator=ge(1))  # rollouts per prompt (G)
        rectification: bool = True  # temporal gradient rectification: weight step k's loss by w_k

    def rollout(
        self, backbone: Backbone, prompts: list[str], plan: Plan, schedule: Schedule, rng: RolloutRNG
    ) -> Rollout:
        pool = candidate_pool(plan)
        starts = torch.tensor([plan.units[k].start for k in pool], dtype=torch.long)
        sizes = torch.tensor(plan.sizes(len(prompts), self.config.group_size))
        nfe0 = backbone.nfe
        cond = backbone.encode(prompts)
        rollout_prompt = torch.arange(len(prompts)).repeat_interleave(sizes)
        if pool:  # each prompt's position in the pool, from its own generator; then its rollouts'
            drawn = torch.cat([torch.randint(len(pool), (1,), generator=rng.generators[p])
                               for p in range(len(prompts))])
            choice = drawn[rollout_prompt]
            sde_step, unit = starts[choice], torch.tensor(pool)[choice]
            weight = (rectification_weights(schedule, starts.tolist()) if self.config.rectification
                      else torch.ones(len(pool)))[choice]
        else:  # a plan that trains no unit (a forward-process loss): every rollout is ODE
            sde_step = torch.full((len(rollout_prompt),), -1, dtype=torch.long)
            unit, weight = torch.zeros_like(sde_step), torch.ones(len(rollout_prompt))
        x = rng.randn(rollout_prompt, backbone.latent_shape, backbone.device)
        x, transitions = self.denoise(backbone, x, cond.take(rollout_prompt), rollout_prompt, sde_step, unit, weight,
                                      schedule, rng)
        return Rollout(
            prompts=list(prompts),
            cond=cond,
            images=backbone.decode(x),
            rollout_prompt=rollout_prompt,
            group=rollout_prompt.clone(),
            transitions=transitions,
            nfe=backbone.nfe - nfe0,
            final_latents=x,
            extras={"sde_step": PerRollout(sde_step)},  # -1: none (an all-ODE rollout)
        )

    def denoise(
        self,
        backbone: Backbone,
        x: Tensor,
        cond: Conditioning,
        rollout_prompt: Tensor,
        sde_step: Tensor,
        unit: Tensor,
        weight: Tensor,
        schedule: Schedule,
        rng: RolloutRNG,
    ) -> tuple[Tensor, Transitions]:
        """Walk every row down the grid: row ``r`` takes the kernel's step at grid step ``sde_step[r]`` (recorded
        with plan unit ``unit[r]`` and loss weight ``weight[r]``) and the Euler ODE step everywhere else. At each
        step the stochastic rows and the others are two transformer calls (the latter marked untrained)."""
        sigmas = schedule.tensor().to(x.device)
        x, parts = x.float(), []
        for step in range(schedule.num_steps):
            s, s_next = sigmas[step], sigmas[step + 1]
            here = sde_step == step
            sde, ode = here.nonzero().flatten(), (~here).nonzero().flatten()
            nxt = torch.empty_like(x)
            if not len(sde):  # every row by ODE: one call on the whole batch
                with untrained_forwards():
                    v = backbone.velocity(x, s.expand(len(ode)), cond)
                nxt = euler_step(x, v.float(), s, s_next)
            elif len(ode):
                rows = ode.to(x.device)
                with untrained_forwards():
                    v = backbone.velocity(x[rows], s.expand(len(ode)), cond.take(ode))
                nxt[rows] = euler_step(x[rows], v.float(), s, s_next)
            if len(sde):
                rows, n = sde.to(x.device), len(sde)
                inputs = x[rows]
                v = backbone.velocity(inputs, s.expand(n), cond.take(sde))
                noise = rng.randn(rollout_prompt[sde], x.shape[1:], x.device)
                out = schedule.kernel.step(inputs, v, s.expand(n), s_next.expand(n), schedule.s_at_one, noise)
                parts.append(Transitions(
                    inputs=inputs, input_s=s.expand(n).clone(), input_cond=rollout_prompt[sde],
                    input_index=torch.arange(n), s_next=s_next.expand(n).clone(), x_next=out.next,
                    log_prob=out.log_prob, rollout_index=sde, unit_index=unit[sde], weight=weight[sde],
                ))
                nxt[rows] = out.next
            x = nxt
        return x, (Transitions.concat(parts) if parts else empty_transitions())
