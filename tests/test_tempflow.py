"""TempFlow-GRPO: branch-step selection, per-(prompt, step) groups and cost, noise-aware weights, and
equivalence with E-GRPO for one single-step unit."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import ROOT, shipped_tiny, tiny_recipe
from flowrl_zoo.tempflow_grpo import step_std

import flowrl
from flowrl import RecipeError
from flowrl.config.recipe import recipe_from_dict
from flowrl.core.rng import RolloutRNG
from flowrl.core.types import Plan, RewardBatch, Schedule, Unit
from flowrl.trainer import Trainer


def setup(n: int = 6, **sampler: object) -> tuple:
    backbone = flowrl.build("backbone", {"type": "tiny_flux", "resolution": 16})
    branch = flowrl.build("sampler", {"type": "tempflow_branch", "group_size": 3, **sampler})
    schedule = Schedule(backbone.schedule_sigmas(n, 3.0), flowrl.build("kernel", {"type": "flow_grpo_sde"}))
    return backbone, branch, schedule


def steps_of(config: dict, n: int) -> list[int]:
    selector = flowrl.build("selector", {"type": "tempflow_steps", **config})
    plan = selector.plan(setup(n)[2], 0, torch.Generator())
    assert all(u.merge == 1 for u in plan.units) and plan.trained == tuple(range(len(plan.units)))
    return [u.start for u in plan.units]


def test_branch_steps() -> None:
    assert steps_of({}, 5) == [0, 1, 2, 3]  # every step but the last
    assert steps_of({"include_last": True}, 5) == [0, 1, 2, 3, 4]
    assert steps_of({"every": 3}, 10) == [0, 3, 6]
    assert steps_of({"every": 2, "offset": 1}, 10) == [1, 3, 5, 7]
    assert steps_of({"steps": [2, 5]}, 10) == [2, 5]
    data = tiny_recipe()
    data["selector"] = {"type": "tempflow_steps", "steps": [1, 7]}
    with pytest.raises(RecipeError, match=r"\[selector.steps\] step 7 is beyond"):
        recipe_from_dict(data)
    data["selector"] = {"type": "tempflow_steps", "steps": [3, 1]}
    with pytest.raises(RecipeError, match="distinct, increasing"):
        recipe_from_dict(data)


def test_branches_share_x_t_groups_per_prompt_and_step_and_cost() -> None:
    backbone, branch, schedule = setup(6, noise_weighting=False)
    plan = Plan(units=(Unit(0), Unit(2), Unit(4)), trained=(0, 1, 2))
    before = backbone.nfe
    with torch.no_grad():
        rollout = branch.rollout(backbone, ["a", "b"], plan, schedule, RolloutRNG(0, 0, [0, 1]))
    n, g, p = 6, 3, 2
    assert rollout.nfe == backbone.nfe - before == p * (5 + g * ((n - 1) + (n - 3) + (n - 5)))  # anchor: steps 0..4
    groups = rollout.group.tolist()
    assert len(set(groups)) == p * 3 and all(groups.count(k) == g for k in set(groups))
    t = rollout.transitions
    assert t.num_inputs == p * 3 and len(t) == p * 3 * g  # one input per (prompt, step) serves its K branches
    assert torch.equal(t.weight, torch.ones(len(t)))


def test_noise_aware_weights() -> None:
    backbone, branch, schedule = setup(6)
    plan = Plan(units=(Unit(0), Unit(2), Unit(4)), trained=(0, 1, 2))
    with torch.no_grad():
        rollout = branch.rollout(backbone, ["a", "b"], plan, schedule, RolloutRNG(0, 0, [0, 1]))
    std = step_std(schedule, [0, 2, 4])
    t = rollout.transitions
    expected = (std / std.mean())[t.unit_index]
    assert torch.allclose(t.weight, expected) and float(t.weight.mean()) == pytest.approx(1.0, abs=1e-6)
    assert float(t.weight[t.unit_index == 0][0]) > float(t.weight[t.unit_index == 2][0])  # early steps are noisier
    # std_t = sigma_t sqrt(-dt) of the Flow-GRPO kernel
    s, s1 = schedule.sigmas[2], schedule.sigmas[3]
    assert float(std[1]) == pytest.approx(0.7 * math.sqrt(s / (1 - s)) * math.sqrt(s - s1), rel=1e-5)
    scaled = setup(6, weight_scale=2.25)[1]
    with torch.no_grad():
        fixed = scaled.rollout(backbone, ["a", "b"], plan, schedule, RolloutRNG(0, 0, [0, 1]))
    assert torch.allclose(fixed.transitions.weight, 2.25 * std[t.unit_index])
    assert torch.equal(fixed.images, rollout.images)  # weighting never changes the samples


def test_merged_units_are_refused() -> None:
    backbone, branch, schedule = setup(6)
    with pytest.raises(ValueError, match="branches single steps"):
        branch.rollout(backbone, ["a"], Plan((Unit(1, 2),), (0,)), schedule, RolloutRNG(0, 0, [0]))


def egrpo_and_tempflow(step: int) -> tuple[dict, dict]:
    egrpo = tiny_recipe(max_steps=2)
    egrpo["selector"] = {"type": "egrpo_entropy", "units": [[step, 1]]}
    egrpo["schedule"] = {"num_steps": 6, "shift": 3.0}
    egrpo["sampler"] = {"type": "anchor_branch", "group_size": 4}
    temp = tiny_recipe(max_steps=2)
    temp["selector"] = {"type": "tempflow_steps", "steps": [step]}
    temp["sampler"] = {**egrpo["sampler"], "type": "tempflow_branch", "noise_weighting": False}
    temp["schedule"] = egrpo["schedule"]
    return egrpo, temp


def test_one_step_without_weighting_equals_egrpo_rollouts_and_advantages() -> None:
    egrpo, temp = (recipe_from_dict(d) for d in egrpo_and_tempflow(2))
    backbone = egrpo.build("backbone")
    schedule = Schedule(backbone.schedule_sigmas(6, 3.0), egrpo.build("kernel"))
    out = []
    for recipe in (egrpo, temp):
        plan = recipe.build("selector").plan(schedule, 0, torch.Generator())
        with torch.no_grad():
            rollout = recipe.build("sampler").rollout(backbone, ["a", "b"], plan, schedule, RolloutRNG(0, 0, [0, 1]))
        rewards = RewardBatch({"r": rollout.images.flatten(1).mean(1)}, {"r": 1.0})
        out.append((plan, rollout, recipe.build("advantage")(rewards, rollout)))
    (plan_e, a, adv_a), (plan_t, b, adv_b) = out
    assert plan_e.units == plan_t.units == (Unit(2),)
    # exact: tempflow_branch without weighting runs anchor_branch's rollout (the same draws and forwards)
    assert torch.equal(a.images, b.images) and torch.equal(a.group, b.group) and a.nfe == b.nfe
    for field in ("inputs", "x_next", "log_prob", "input_index", "rollout_index", "weight"):
        assert torch.equal(getattr(a.transitions, field), getattr(b.transitions, field))
    assert torch.equal(adv_a.values, adv_b.values)


def test_one_step_without_weighting_equals_egrpo_training(tmp_path: Path) -> None:
    results = []
    for name, data in zip(("egrpo", "tempflow"), egrpo_and_tempflow(2), strict=True):
        trainer = Trainer(recipe_from_dict(data), tmp_path / name, quiet=True)
        trainer.run()
        row = json.loads((tmp_path / name / "metrics.jsonl").read_text().splitlines()[-1])
        results.append((row, {n: p.detach().clone() for n, p in trainer.named_params}))
    (row_e, w_e), (row_t, w_t) = results
    for key in ("loss", "reward/total", "nfe", "advantage/abs_mean", "ratio_mean", "grad_norm"):
        assert row_t[key] == row_e[key]  # bit-identical: the same sampler code with weights 1
    assert all(torch.equal(w_t[n], w_e[n]) for n in w_e)


def test_recipe_runs_two_iterations(tmp_path: Path) -> None:
    overrides = ["sampler.group_size=2"]
    Trainer(shipped_tiny("tempflow_grpo", overrides), tmp_path / "run", quiet=True).run()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    g, p = 2, 2  # N = 10, every = 5: branches at steps 0 and 5, tails 9 + 4
    assert [r["nfe"] for r in rows] == [k * p * (6 + g * (9 + 4)) for k in (1, 2)]  # anchor: steps 0..5
    assert all(math.isfinite(r["loss"]) for r in rows)


def test_paper_recipe_runs_on_the_tiny_sd3_with_cfg(tmp_path: Path) -> None:
    """recipes/sd3/tempflow_grpo_hps.toml with the tiny SD3 in place of SD3.5-M (CFG 4.5: two rows per call)."""
    import tomllib

    data = tomllib.loads((ROOT / "recipes" / "sd3" / "tempflow_grpo_hps.toml").read_text())
    data["backbone"] = {"type": "tiny_sd3", "resolution": 16, "num_layers": 1, "guidance_scale": 4.5}
    data["prompts"] = {"type": "list", "prompts": ["a red circle", "a cat"]}
    data["reward"] = [{"type": "jpeg_compressibility"}]
    data["selector"]["every"] = 4  # steps 0, 4, 8
    data["sampler"]["group_size"] = 2
    data["trainer"] = {"max_steps": 1, "prompts_per_step": 1, "checkpoint_every": 0, "image_every": 0}
    Trainer(recipe_from_dict(data), tmp_path / "run", quiet=True).run()
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["nfe"] == 2 * (9 + 2 * (9 + 5 + 1))  # anchor: steps 0..8 and math.isfinite(row["loss"])
