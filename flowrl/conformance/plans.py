"""Conformance of the parts that shape a rollout: timestep selectors, rollout samplers, transition kernels."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from flowrl.conformance.common import ConformanceError, counting_rows
from flowrl.conformance.common import require as _require
from flowrl.core.interfaces import Backbone, RolloutSampler, TimestepSelector, TransitionKernel
from flowrl.core.rng import RolloutRNG
from flowrl.core.types import Plan, PlanError, Rollout, Schedule


# -- selectors -----------------------------------------------------------------------------------
def _same_plan(a: Plan, b: Plan) -> bool:
    return a.units == b.units and a.trained == b.trained and a.group_sizes == b.group_sizes


def check_selector(
    make: Callable[[], TimestepSelector],
    schedule: Schedule,
    iterations: int = 4,
    observe: Callable[[TimestepSelector], None] | None = None,
) -> list[Plan]:
    """Rules: every plan fits the schedule (units inside it, ordered, not overlapping, trained indices valid);
    the same iteration and generator seed give the same plan from a fresh instance (determinism); a fresh
    instance loaded with ``state_dict()`` plans the next iteration exactly as the original. ``observe`` is
    called before each plan (selectors that probe the model: pass a closure over a backbone and prompts).
    Returns the plans."""
    selector, twin = make(), make()
    plans = []
    for iteration in range(iterations):
        for part in (selector, twin):
            if observe is not None:
                observe(part)
        plan = selector.plan(schedule, iteration, torch.Generator().manual_seed(1000 + iteration))
        again = twin.plan(schedule, iteration, torch.Generator().manual_seed(1000 + iteration))
        try:
            plan.check(schedule.num_steps)
        except PlanError as error:
            raise ConformanceError(f"{type(selector).__name__}: iteration {iteration}: {error}") from None
        _require(len(set(plan.trained)) == len(plan.trained), selector, f"trained indices repeat: {plan.trained}")
        _require(_same_plan(plan, again), selector, f"iteration {iteration}: the same generator gave another plan")
        plans.append(plan)
    restored = make()
    restored.load_state_dict(selector.state_dict())
    for part in (selector, restored):
        if observe is not None:
            observe(part)
    nxt = selector.plan(schedule, iterations, torch.Generator().manual_seed(7))
    _require(
        _same_plan(nxt, restored.plan(schedule, iterations, torch.Generator().manual_seed(7))),
        selector,
        "a fresh instance loaded with state_dict() plans differently (state missing from state_dict)",
    )
    return plans


# -- samplers ------------------------------------------------------------------------------------
def check_sampler(
    make: Callable[[], RolloutSampler], backbone: Backbone, schedule: Schedule, plan: Plan, prompts: Sequence[str]
) -> Rollout:
    """Rules: images ``(R, 3, H, W)`` in [0, 1] with one prompt index and one group per rollout; transitions
    that index existing inputs, rollouts and plan units, with finite old log-densities; ``rollout.nfe`` equal to
    the transformer rows the backbone evaluated and to the backbone's own counter; as many rollouts as
    :meth:`~flowrl.core.interfaces.RolloutSampler.rollout_count` declares (the memory pre-check sizes the iteration
    with it); the same :class:`~flowrl.core.rng.RolloutRNG` gives the same images from a fresh instance. Returns the
    rollout."""
    sampler = make()
    prompts = list(prompts)
    rows = range(len(prompts))
    nfe0 = backbone.nfe
    with torch.no_grad(), counting_rows(backbone.module) as counter:
        rollout = sampler.rollout(backbone, prompts, plan, schedule, RolloutRNG(0, 0, rows))
    name = type(sampler).__name__
    images, r = rollout.images, rollout.num_rollouts
    shape = tuple(images.shape)
    _require(images.dim() == 4 and shape[1] == 3, sampler, f"images must be (R, 3, H, W), got {shape}")
    _require(bool(torch.isfinite(images).all()) and float(images.min()) >= 0 and float(images.max()) <= 1, sampler,
             "images must be finite and in [0, 1]")
    _require(tuple(rollout.rollout_prompt.shape) == (r,) and tuple(rollout.group.shape) == (r,), sampler,
             "rollout_prompt and group need one entry per rollout")
    _require(set(rollout.rollout_prompt.tolist()) <= set(rows), sampler, "rollout_prompt indexes a missing prompt")
    _require(len(rollout.cond) == len(prompts), sampler, "cond needs one row per prompt")
    declared = sampler.rollout_count(plan, len(prompts))
    _require(declared == r, sampler, f"rollout_count() declares {declared} rollouts for this plan; rollout() gave {r}")
    t = rollout.transitions
    if len(t):
        _require(int(t.input_index.max()) < t.num_inputs and int(t.input_index.min()) >= 0, sampler,
                 "a transition starts from an input that does not exist")
        _require(int(t.rollout_index.max()) < r, sampler, "a transition trains a rollout that does not exist")
        units = max(1, len(plan.units))
        _require(int(t.unit_index.max()) < units, sampler, "a transition names a unit outside the plan")
        _require(bool(torch.isfinite(t.log_prob).all()), sampler, "old log-densities must be finite")
        same = len(t.s_next) == len(t) == len(t.x_next) == len(t.weight)
        _require(same, sampler, "transition fields differ in length")
    _require(rollout.nfe == counter[0], sampler,
             f"rollout.nfe = {rollout.nfe} but the transformer evaluated {counter[0]} rows")
    _require(backbone.nfe - nfe0 == counter[0], sampler,
             f"the backbone counted {backbone.nfe - nfe0} evaluations for {counter[0]} rows")
    with torch.no_grad():
        again = make().rollout(backbone, prompts, plan, schedule, RolloutRNG(0, 0, rows))
    _require(torch.equal(again.images, images), sampler, f"{name}: the same RolloutRNG gave other images")
    return rollout


# -- kernels -------------------------------------------------------------------------------------
def check_kernel(kernel: TransitionKernel, schedule: Schedule, latent_shape: Sequence[int] = (16, 12)) -> None:
    """Rules, at every step of ``schedule``: the mean is shaped like the latent and finite; the std has one
    non-negative finite value per row and does not depend on the latent or the velocity (``std_only``
    agrees); a step with zero noise lands on the mean; the log-density is finite where the std is positive
    and highest at the mean."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn((3, *latent_shape), generator=g)
    v = torch.randn((3, *latent_shape), generator=g)
    sig = schedule.sigmas
    for i in range(schedule.num_steps):
        s = torch.full((3,), float(sig[i]))
        s_next = torch.full((3,), float(sig[i + 1]))
        mean, std = kernel.mean_std(x, v, s, s_next, schedule.s_at_one)
        where = f"step {i}"
        _require(tuple(mean.shape) == tuple(x.shape) and bool(torch.isfinite(mean).all()), kernel,
                 f"{where}: the mean must be finite and shaped like the latent")
        _require(tuple(std.shape) == (3,) and bool(torch.isfinite(std).all()) and float(std.min()) >= 0, kernel,
                 f"{where}: the std must be (B,), finite and non-negative")
        _, other_std = kernel.mean_std(x * 2 + 1, v * 3, s, s_next, schedule.s_at_one)
        only = kernel.std_only(s, s_next, schedule.s_at_one)
        _require(torch.allclose(other_std, std) and torch.allclose(only.reshape(-1), std), kernel,
                 f"{where}: the std must not depend on the latent or the velocity")
        step = kernel.step(x, v, s, s_next, schedule.s_at_one, torch.zeros_like(x))
        _require(torch.equal(step.next, mean), kernel, f"{where}: a step with zero noise must land on the mean")
        if float(std.min()) > 0:
            at_mean = kernel.log_prob(mean, mean, std)
            off = kernel.log_prob(mean + std.reshape(-1, *[1] * len(latent_shape)), mean, std)
            _require(bool(torch.isfinite(at_mean).all()) and bool((at_mean > off).all()), kernel,
                     f"{where}: the log-density must be finite and highest at the mean")
