"""health/kl_initial and health/velocity_drift: how far the policy moved from the initial one."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from conftest import tiny_recipe

import flowrl
from flowrl.config.recipe import recipe_from_dict
from flowrl.core.rng import RolloutRNG
from flowrl.core.types import Plan, Schedule, Unit
from flowrl.trainer import train
from flowrl.trainer.drift import policy_drift, spread_ids


def last_row(run: Path) -> dict:
    return json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])


def test_a_known_velocity_change_gives_the_gaussian_kl() -> None:
    """The 'initial policy' is the same model with a constant delta added to its velocity. Each kernel mean is
    linear in the velocity, so the two means differ by the mean of (x = 0, v = delta), and the KL per dimension
    is that squared over 2 std^2, averaged over the stochastic transitions."""
    backbone = flowrl.build("backbone", {"type": "tiny_flux", "resolution": 16})
    sampler = flowrl.build("sampler", {"type": "independent", "group_size": 2})
    kernel = flowrl.build("kernel", {"type": "flow_grpo_sde", "noise_level": 0.7})
    schedule = Schedule(backbone.schedule_sigmas(4, 3.0), kernel)
    plan = Plan(units=(Unit(0), Unit(2)), trained=(0, 1))
    with torch.no_grad():
        prompts = ["a red circle", "two blue squares"]
        rollout = sampler.rollout(backbone, prompts, plan, schedule, RolloutRNG(0, 0, [0, 1]))
    transitions = rollout.transitions
    delta = 0.05
    velocity = backbone.velocity

    @contextmanager
    def shifted() -> Iterator[None]:
        backbone.velocity = lambda x, s, c: velocity(x, s, c) + delta  # type: ignore[method-assign]
        try:
            yield
        finally:
            del backbone.velocity

    out = policy_drift(backbone, kernel, schedule, rollout.cond, transitions, shifted)
    zeros = torch.zeros_like(transitions.inputs[:1]).float()
    expected = []
    for t in range(len(transitions)):
        s = transitions.input_s[transitions.input_index[t]].reshape(1)
        step, std = kernel.mean_std(zeros, zeros + delta, s, transitions.s_next[t].reshape(1), schedule.s_at_one)
        expected.append(float(step.square().mean() / (2 * std.square())))
    # float32 means in another order: 1e-4 relative is far above their rounding (about 1e-7 relative)
    assert abs(out["health/kl_initial"] / (sum(expected) / len(expected)) - 1) < 1e-4
    x = transitions.inputs
    s = transitions.input_s
    with torch.no_grad():
        v = velocity(x, s, rollout.cond.take(transitions.input_cond)).float()
    rms_ref = float((v + delta).square().mean().sqrt())
    assert abs(out["health/velocity_drift"] / (delta / rms_ref) - 1) < 1e-4


def test_spread_ids_cover_the_range() -> None:
    assert spread_ids(5, 10).tolist() == [0, 1, 2, 3, 4]
    ids = spread_ids(100, 5).tolist()
    assert ids[0] == 0 and ids[-1] == 99 and len(ids) == 5 and ids == sorted(set(ids))


def test_a_run_logs_its_drift_from_the_initial_policy(tmp_path: Path) -> None:
    """With lr 1e-30 the policy stays the initial one (steps below float32 rounding of any weight but exact
    zeros): drift 0 to 1e-20. With a large lr it moves: both figures positive, at the last step (kl_every
    larger than the run)."""
    still = tiny_recipe(max_steps=2, kl_every=10)
    still["optim"]["lr"] = 1e-30
    row = last_row(train(recipe_from_dict(still), tmp_path / "still", quiet=True))
    assert 0 <= row["health/kl_initial"] < 1e-20 and 0 <= row["health/velocity_drift"] < 1e-20
    moving = tiny_recipe(max_steps=2, kl_every=10)
    moving["optim"]["lr"] = 3e-3
    run = train(recipe_from_dict(moving), tmp_path / "moving", quiet=True)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert "health/kl_initial" not in rows[0]  # step 1: not a multiple of 10, not the last
    assert rows[-1]["health/kl_initial"] > 0 and rows[-1]["health/velocity_drift"] > 0
    off = tiny_recipe(max_steps=1, kl_every=0)
    assert "health/velocity_drift" not in last_row(train(recipe_from_dict(off), tmp_path / "off", quiet=True))
