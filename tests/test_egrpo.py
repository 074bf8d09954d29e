"""E-GRPO: the unit rule, the shared-anchor sampler's costs and tails, and per-unit advantages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import tiny_recipe
from flowrl_zoo.egrpo import greedy_units

import flowrl
from flowrl.config.recipe import recipe_from_dict
from flowrl.core.rng import RolloutRNG
from flowrl.core.types import Plan, RewardBatch, Schedule, Unit
from flowrl.parts.advantages import group_normalize
from flowrl.parts.entropy import merged_entropy
from flowrl.parts.samplers.walk import walk
from flowrl.trainer import Trainer


def paper_schedule(n: int = 16) -> Schedule:
    kernel = flowrl.build("kernel", {"type": "flow_grpo_sde", "noise_level": 0.7})
    from flowrl.core.schedule import shifted_sigmas

    return Schedule(tuple(float(s) for s in shifted_sigmas(n, 3.0)), kernel)


def test_units_of_the_research_setting() -> None:
    schedule = paper_schedule()
    selector = flowrl.build("selector", {"type": "egrpo_entropy", "tau": 1.0})
    plan = selector.plan(schedule, 0, torch.Generator())
    assert [(u.start, u.merge) for u in plan.units] == [(0, 1), (1, 1), (2, 2), (4, 3)]
    no_budget = greedy_units(schedule, tau=1.0, end_by=16, max_merge=8)
    assert no_budget[:5] == [(0, 1), (1, 1), (2, 2), (4, 3), (7, 5)]


def test_merging_raises_entropy() -> None:
    schedule = paper_schedule()
    for start in range(0, 12):
        values = [merged_entropy(schedule, start, m) for m in range(1, 5)]
        assert values == sorted(values) and values[0] < values[-1]


def tiny_egrpo(**trainer: object) -> dict:
    data = tiny_recipe(**trainer)
    data["selector"] = {"type": "egrpo_entropy", "units": [[0, 1], [1, 2]]}
    data["schedule"] = {"num_steps": 6, "shift": 3.0}
    data["sampler"] = {"type": "anchor_branch", "group_size": 3}
    return data


@pytest.mark.parametrize("update", ["recompute", "retain"])
def test_nfe_is_the_minimum_and_logged(tmp_path: Path, update: str) -> None:
    recipe = recipe_from_dict(tiny_egrpo(max_steps=2, update=update))
    trainer = Trainer(recipe, tmp_path / "run", quiet=True)
    counted = {"rows": 0}
    original = trainer.update

    def counting_update(*args: object) -> dict:
        before = trainer.backbone.nfe
        out = original(*args)  # type: ignore[arg-type]
        counted["rows"] = trainer.backbone.nfe - before
        return out

    trainer.update = counting_update  # type: ignore[method-assign]
    trainer.run()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    n, g, p = 6, 3, 2
    per_prompt = (1 + 1) + g * ((n - 0 - 1) + (n - 1 - 2))  # the anchor stops at the last start, 1
    assert [r["nfe"] for r in rows] == [p * per_prompt, 2 * p * per_prompt]
    # Training: one transformer row per (prompt, unit), shared by the unit's G rollouts; recomputed, or found
    # among the rollout's kept forwards (then the update runs no forward at all)
    assert counted["rows"] == (p * 2 if update == "recompute" else 0)
    if update == "retain":
        assert all(r["update/retained_used"] == p * 2 and r["update/recomputed_rows"] == 0 for r in rows)


def test_tail_starts_after_the_merged_jump() -> None:
    """With zero noise the jump is deterministic, so the image must be: anchor to i, one merged step to
    i + m, then ODE from i + m. A tail restarted at i + 1 gives a different image."""
    backbone = flowrl.build("backbone", {"type": "tiny_flux", "resolution": 16})
    sampler = flowrl.build("sampler", {"type": "anchor_branch", "group_size": 2})
    kernel = flowrl.build("kernel", {"type": "flow_grpo_sde", "noise_level": 0.0})
    schedule = Schedule(backbone.schedule_sigmas(6, 3.0), kernel)
    plan = Plan(units=(Unit(1, 3),), trained=(0,))
    prompts = ["a red circle"]
    with torch.no_grad():
        rollout = sampler.rollout(backbone, prompts, plan, schedule, RolloutRNG(0, 0, [0]))
        x1 = RolloutRNG(0, 0, [0]).randn(torch.arange(1), backbone.latent_shape)
        cond = backbone.encode(prompts)
        rows = torch.arange(1)
        x = walk(backbone, x1, cond, rows, 0, Plan((), ()), schedule, None, stop=1)
        merged = Plan(units=(Unit(1, 3),), trained=())
        expected = walk(backbone, x, cond, rows, 1, merged, schedule, RolloutRNG(0, 0, [0]))
        wrong = walk(backbone, x, cond, rows, 1, merged, schedule, RolloutRNG(0, 0, [0]), stop=4)
        wrong = walk(backbone, wrong, cond, rows, 2, Plan((), ()), schedule, None)
    images = backbone.decode(expected)
    assert torch.allclose(rollout.images[0], images[0], atol=1e-5)
    assert torch.allclose(rollout.images[1], images[0], atol=1e-5)
    assert not torch.allclose(backbone.decode(wrong)[0], images[0], atol=1e-3)


def test_rollouts_in_a_unit_differ_and_share_the_input() -> None:
    backbone = flowrl.build("backbone", {"type": "tiny_flux", "resolution": 16})
    sampler = flowrl.build("sampler", {"type": "anchor_branch", "group_size": 4})
    schedule = Schedule(backbone.schedule_sigmas(6, 3.0), flowrl.build("kernel", {"type": "flow_grpo_sde"}))
    plan = Plan(units=(Unit(0, 1), Unit(1, 2)), trained=(0, 1))
    with torch.no_grad():
        rollout = sampler.rollout(backbone, ["a", "b"], plan, schedule, RolloutRNG(0, 0, [0, 1]))
    assert rollout.num_rollouts == 2 * 2 * 4
    t = rollout.transitions
    assert t.num_inputs == 4 and len(t) == 16
    assert torch.equal(t.input_index, torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3]))
    # G different images per (prompt, unit) group.
    groups = rollout.group.tolist()
    assert sorted(set(groups)) == [0, 1, 2, 3] and all(groups.count(k) == 4 for k in range(4))
    first = rollout.images[:4].flatten(1)
    assert torch.cdist(first, first).fill_diagonal_(1.0).min() > 1e-4


@pytest.mark.parametrize("mode", ["sum_then_normalize", "normalize_then_sum"])
def test_single_unit_equals_plain_group_norm(mode: str) -> None:
    backbone = flowrl.build("backbone", {"type": "tiny_flux", "resolution": 16})
    sampler = flowrl.build("sampler", {"type": "anchor_branch", "group_size": 5})
    schedule = Schedule(backbone.schedule_sigmas(4, 3.0), flowrl.build("kernel", {"type": "flow_grpo_sde"}))
    with torch.no_grad():
        rollout = sampler.rollout(
            backbone, ["a", "b", "c"], Plan((Unit(2, 1),), (0,)), schedule, RolloutRNG(0, 0, [0, 1, 2])
        )
    rewards = torch.randn(rollout.num_rollouts)
    estimator = flowrl.build("advantage", {"type": "group_norm", "multi_reward": mode})
    out = estimator(RewardBatch({"r": rewards}, {"r": 1.0}), rollout)
    plain = group_normalize(rewards, rollout.rollout_prompt, eps=1e-4, clip=5.0)
    assert torch.allclose(out.values, plain, atol=1e-6)


def test_first_update_on_policy(tmp_path: Path) -> None:
    recipe = recipe_from_dict(tiny_egrpo(max_steps=1))
    Trainer(recipe, tmp_path / "run", quiet=True).run()
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert abs(row["ratio_mean"] - 1) < 1e-6 and row["clip_frac"] == 0.0


@pytest.mark.parametrize("solver", ["euler", "dpm_solver_2m"])
def test_coarse_tails_cost_their_intervals_and_keep_the_jumps(solver: str) -> None:
    """``tail_steps = k``: each rollout's tail costs min(k, N - i - m) evaluations; the jumps, their inputs and
    log-densities are the full-tail sampler's exactly (the same draws), only the images change."""
    backbone = flowrl.build("backbone", {"type": "tiny_flux", "resolution": 16})
    schedule = Schedule(backbone.schedule_sigmas(8, 3.0), flowrl.build("kernel", {"type": "flow_grpo_sde"}))
    plan = Plan(units=(Unit(0, 1), Unit(1, 2), Unit(5, 1)), trained=(0, 1, 2))
    g, prompts, k = 3, ["a", "b"], 2
    out = {}
    for steps in (0, k):
        sampler = flowrl.build("sampler", {"type": "anchor_branch", "group_size": g, "tail_solver": solver,
                                           "tail_steps": steps})
        with torch.no_grad():
            out[steps] = sampler.rollout(backbone, prompts, plan, schedule, RolloutRNG(0, 0, [0, 1]))
    tails = [min(k, 8 - u.end) for u in plan.units]
    assert out[k].nfe == len(prompts) * ((5 + 1) + g * sum(tails))
    assert out[0].nfe == len(prompts) * ((5 + 1) + g * sum(8 - u.end for u in plan.units))
    full, coarse = out[0].transitions, out[k].transitions
    assert torch.equal(full.x_next, coarse.x_next) and torch.equal(full.log_prob, coarse.log_prob)
    assert not torch.allclose(out[0].images, out[k].images, atol=1e-3)


def test_a_tail_as_fine_as_the_grid_equals_the_batched_euler_tails() -> None:
    backbone = flowrl.build("backbone", {"type": "tiny_flux", "resolution": 16})
    schedule = Schedule(backbone.schedule_sigmas(6, 3.0), flowrl.build("kernel", {"type": "flow_grpo_sde"}))
    plan = Plan(units=(Unit(0, 1), Unit(2, 2)), trained=(0, 1))
    images = []
    for steps in (0, 6):  # 6 intervals cover every remaining step: the same Euler steps, unit by unit
        sampler = flowrl.build("sampler", {"type": "anchor_branch", "group_size": 2, "tail_steps": steps})
        with torch.no_grad():
            images.append(sampler.rollout(backbone, ["a", "b"], plan, schedule, RolloutRNG(0, 0, [0, 1])).images)
    # the same arithmetic in different batch compositions: float32 rounding only
    torch.testing.assert_close(images[0], images[1], rtol=1e-5, atol=1e-5)


def test_units_as_a_tree_of_merged_jumps() -> None:
    """E-GRPO's units as the split points of a rollout tree (branch_tree): a merged unit is one SDE jump per
    child over its whole span; every node is evaluated once, so a prompt costs the sum of its rows per step."""
    backbone = flowrl.build("backbone", {"type": "tiny_flux", "resolution": 16})
    schedule = Schedule(backbone.schedule_sigmas(6, 3.0), flowrl.build("kernel", {"type": "flow_grpo_sde"}))
    plan = Plan(units=(Unit(0, 1), Unit(1, 1), Unit(2, 2)), trained=(0, 1, 2))
    sampler = flowrl.build("sampler", {"type": "branch_tree", "factor": 2})
    with torch.no_grad():
        rollout = sampler.rollout(backbone, ["a", "b"], plan, schedule, RolloutRNG(0, 0, [0, 1]))
    # rows per step: 1 at step 0, 2 at step 1, 4 at step 2 (jumping to step 4), then 8 at steps 4 and 5
    assert rollout.nfe == 2 * (1 + 2 + 4 + 8 + 8)
    assert rollout.num_rollouts == 2 * 8
    t = rollout.transitions
    merged = t.unit_index == 2
    assert torch.allclose(t.s_next[merged], torch.full((int(merged.sum()),), schedule.sigmas[4]))
    assert len(t) == 2 * (2 + 4 + 8) and t.num_inputs == 2 * (1 + 2 + 4)
