"""Walking a batch of latents down the schedule: the shared inner loop of every sampler."""

from __future__ import annotations

import torch
from torch import Tensor

from flowrl.core.interfaces import Backbone
from flowrl.core.rng import RolloutRNG
from flowrl.core.types import Conditioning, Plan, Schedule, Transitions
from flowrl.parts.samplers.solvers import coarse_grid, euler_step, solve
from flowrl.parts.samplers.untrained import untrained_forwards


class TrajectoryRecorder:
    """Collects the trained transitions of a walk (one row per latent in the batch)."""

    def __init__(self, plan: Plan, rollout_index: Tensor) -> None:
        self.plan = plan
        self.rollout_index = rollout_index
        self.parts: list[Transitions] = []

    def record(
        self, unit_index: int, x: Tensor, s: Tensor, cond_rows: Tensor, s_next: Tensor, x_next: Tensor, log_prob: Tensor
    ) -> None:
        if unit_index not in self.plan.trained:
            return
        n = x.shape[0]
        self.parts.append(
            Transitions(
                inputs=x,
                input_s=s,
                input_cond=cond_rows,
                input_index=torch.arange(n),
                s_next=s_next,
                x_next=x_next,
                log_prob=log_prob,
                rollout_index=self.rollout_index,
                unit_index=torch.full((n,), unit_index, dtype=torch.long),
                weight=torch.ones(n),
            )
        )

    def transitions(self) -> Transitions:
        if not self.parts:
            return empty_transitions()
        return Transitions.concat(self.parts)


def empty_transitions() -> Transitions:
    z = torch.zeros(0)
    zl = torch.zeros(0, dtype=torch.long)
    return Transitions(z[:, None], z, zl, zl, z, z[:, None], z, zl, zl, z)


def walk(
    backbone: Backbone,
    x: Tensor,
    cond: Conditioning,
    cond_rows: Tensor,
    start: int,
    plan: Plan,
    schedule: Schedule,
    rng: RolloutRNG | None,
    recorder: TrajectoryRecorder | None = None,
    stop: int | None = None,
) -> Tensor:
    """Denoise ``x`` from grid step ``start`` to ``stop`` (default: the end): the plan's units as SDE jumps.

    ``cond`` has one row per latent; ``cond_rows`` names each latent's prompt (recorded with transitions,
    and keying the SDE noise to the prompt's generator).
    """
    sigmas = schedule.tensor().to(x.device)
    stop = schedule.num_steps if stop is None else stop
    step = start
    n = x.shape[0]
    while step < stop:
        unit = plan.unit_at(step)
        end = unit.end if unit is not None else step + 1
        s, s_next = sigmas[step].expand(n), sigmas[end].expand(n)
        v = backbone.velocity(x, s, cond)
        if unit is None:
            x = euler_step(x.float(), v, s, s_next)
        else:
            if rng is None:
                raise ValueError("a plan with SDE units needs a RolloutRNG")
            noise = rng.randn(cond_rows, x.shape[1:], x.device)
            out = schedule.kernel.step(x, v, s, s_next, schedule.s_at_one, noise)
            if recorder is not None:
                recorder.record(plan.units.index(unit), x, s, cond_rows, s_next, out.next, out.log_prob)
            x = out.next
        step = end
    return x


def ode_tails(backbone: Backbone, x: Tensor, step: Tensor, cond: Conditioning, schedule: Schedule) -> Tensor:
    """Finish every row by ODE from its own grid step ``step[r]`` to the end, in shared batched calls.

    Rows at different steps share one transformer call (the noise level is per row), so the number of
    calls is the longest tail, and each row costs exactly ``N - step[r]`` evaluations.
    """
    sigmas = schedule.tensor().to(x.device)
    n = schedule.num_steps
    x, step = x.float().clone(), step.clone().to(x.device)
    while bool((step < n).any()):
        active = (step < n).nonzero().flatten()
        k = step[active]
        s, s_next = sigmas[k], sigmas[k + 1]
        with untrained_forwards():  # a tail is never a trained input (flowrl.parts.samplers.untrained)
            v = backbone.velocity(x[active], s, cond.take(active))
        x[active] = euler_step(x[active], v, s, s_next)
        step[active] = k + 1
    return x


def solver_tail(
    backbone: Backbone, x: Tensor, cond: Conditioning, schedule: Schedule, start: int, solver: str, steps: int
) -> Tensor:
    """Finish every row by ODE from grid step ``start`` to ``s = 0`` on a coarse grid: ``steps`` intervals of the
    schedule's own levels (0: every step; :func:`flowrl.parts.samplers.solvers.coarse_grid`), one evaluation each,
    integrated with ``solver`` (``euler`` or ``dpm_solver_2m``)."""
    index = coarse_grid(schedule.num_steps, start, steps)
    sigmas = schedule.tensor().to(x.device)[torch.tensor(index, device=x.device)]
    n = x.shape[0]

    def velocity(latents: Tensor, s: Tensor) -> Tensor:
        with untrained_forwards():  # a tail is never a trained input (flowrl.parts.samplers.untrained)
            return backbone.velocity(latents, s.expand(n), cond)

    return solve(solver, velocity, x, sigmas)
