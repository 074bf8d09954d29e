"""The shared-anchor branching sampler (E-GRPO; TempFlow-GRPO's per-step branching is its m = 1 case).

Each prompt has one initial noise and one deterministic ODE anchor trajectory. For each trained unit
``(i, m)`` every one of the G rollouts jumps from the anchor latent at step ``i`` to step ``i + m`` by one
SDE step with its own noise, then finishes by ODE **from step i + m** (E-GRPO's official release restarts
at ``i + 1``). The jump reuses the anchor's velocity at step ``i``, so a prompt costs
``(i_last + 1) + G * sum(N - i - m)`` transformer evaluations (the anchor stops at the last trained
unit's start ``i_last``), and at training time one forward per (prompt, unit)
serves the whole group. Rollouts are grouped by (prompt, unit).
"""

from __future__ import annotations

from typing import Literal

import attrs
import torch
from attrs.validators import ge
from torch import Tensor

from flowrl.core.contracts import refuses
from flowrl.core.extras import PerRollout
from flowrl.core.interfaces import Backbone, RolloutSampler
from flowrl.core.registry import register
from flowrl.core.rng import RolloutRNG
from flowrl.core.types import Conditioning, Plan, Rollout, Schedule, Transitions
from flowrl.parts.samplers.solvers import euler_step
from flowrl.parts.samplers.walk import ode_tails, solver_tail


@register("sampler", "anchor_branch")
class AnchorBranchSampler(RolloutSampler):
    """Shared ODE anchor per prompt; G SDE jumps per unit from the anchor, ODE tails from i + m (E-GRPO)."""

    requires = (
        refuses(
            "no_trained_units",
            "its rollouts are the jumps from the anchor at each trained unit, so a plan that trains none has no"
            " rollout; use the independent sampler",
        ),
    )

    @attrs.frozen
    class Config:
        group_size: int = attrs.field(default=12, validator=ge(1))  # rollouts per (prompt, unit)
        # the ODE tail after each jump: ``tail_steps`` intervals of the grid from i + m to 0 (0: every step),
        # integrated by ``tail_solver``; coarse tails cut a unit's cost, the jump and its log-density are unchanged
        tail_solver: Literal["euler", "dpm_solver_2m"] = "euler"
        tail_steps: int = attrs.field(default=0, validator=ge(0))

    def rollout_count(self, plan: Plan, num_prompts: int) -> int:
        """A group per (prompt, trained unit): ``G`` (or the plan's group size) jumps each."""
        return sum(plan.sizes(num_prompts, self.config.group_size)) * len(plan.trained)

    def rollout(
        self, backbone: Backbone, prompts: list[str], plan: Plan, schedule: Schedule, rng: RolloutRNG
    ) -> Rollout:
        p = len(prompts)
        sizes = torch.tensor(plan.sizes(p, self.config.group_size))
        r = int(sizes.sum())  # rollouts per unit
        nfe0 = backbone.nfe
        cond = backbone.encode(prompts)
        x1 = rng.randn(torch.arange(p), backbone.latent_shape, backbone.device)
        anchors = anchor_trajectory(backbone, x1, cond, plan, schedule)
        sigmas = schedule.tensor().to(x1.device)
        parts, tails, tail_steps = [], [], []
        prompt_rows = torch.arange(p).repeat_interleave(sizes)
        for order, k in enumerate(plan.trained):
            unit = plan.units[k]
            x, v = anchors[unit.start]
            s, s_next = sigmas[unit.start].expand(r), sigmas[unit.end].expand(r)
            noise = rng.randn(prompt_rows, x.shape[1:], x.device)
            rows = prompt_rows.to(x.device)
            out = schedule.kernel.step(x[rows], v[rows], s, s_next, schedule.s_at_one, noise)
            parts.append(
                Transitions(
                    inputs=x,
                    input_s=sigmas[unit.start].expand(p),
                    input_cond=torch.arange(p),
                    input_index=prompt_rows,
                    s_next=s_next,
                    x_next=out.next,
                    log_prob=out.log_prob,
                    rollout_index=order * r + torch.arange(r),
                    unit_index=torch.full((r,), k, dtype=torch.long),
                    weight=torch.ones(r),
                )
            )
            tails.append(out.next)
            tail_steps.append(unit.end)
        rollout_prompt = prompt_rows.repeat(len(plan.trained))
        final = self.finish(backbone, tails, tail_steps, cond.take(prompt_rows), schedule)
        rollout_unit = torch.tensor(plan.trained).repeat_interleave(r)
        return Rollout(
            prompts=list(prompts),
            cond=cond,
            images=backbone.decode(final),
            rollout_prompt=rollout_prompt,
            group=rollout_unit * p + rollout_prompt,
            transitions=Transitions.concat(parts),
            nfe=backbone.nfe - nfe0,
            final_latents=final,
            extras={"unit": PerRollout(rollout_unit)},  # the plan unit each rollout explored
        )

    def finish(
        self, backbone: Backbone, tails: list[Tensor], starts: list[int], cond: Conditioning, schedule: Schedule
    ) -> Tensor:
        """The final latents of every unit's rollouts (``tails[k]`` jumped to grid step ``starts[k]``; ``cond``
        has one row per rollout of a unit). Full Euler tails share batched calls across units (the noise
        level is per row); coarse or higher-order tails run unit by unit on their own grid."""
        c = self.config
        if c.tail_steps == 0 and c.tail_solver == "euler":
            step = torch.cat([torch.full((len(x),), k, dtype=torch.long) for x, k in zip(tails, starts, strict=True)])
            every = cond.take(torch.arange(len(cond)).repeat(len(tails)))
            return ode_tails(backbone, torch.cat(tails), step, every, schedule)
        return torch.cat([solver_tail(backbone, x, cond, schedule, k, c.tail_solver, c.tail_steps)
                          for x, k in zip(tails, starts, strict=True)])


def anchor_trajectory(
    backbone: Backbone, x: torch.Tensor, cond: Conditioning, plan: Plan, schedule: Schedule
) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Run the deterministic ODE anchor up to the last trained unit's start (nothing later is used); keep
    (latent, velocity) at every trained unit's start. Costs ``i_last + 1`` evaluations per prompt."""
    sigmas = schedule.tensor().to(x.device)
    starts = {plan.units[k].start for k in plan.trained}
    kept = {}
    for step in range(max(starts, default=-1) + 1):
        s = sigmas[step].expand(x.shape[0])
        v = backbone.velocity(x, s, cond)
        if step in starts:
            kept[step] = (x, v)
        if step < max(starts):
            x = euler_step(x, v, sigmas[step], sigmas[step + 1])
    return kept
