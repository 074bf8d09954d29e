"""Flash-GRPO: one SDE step per rollout at a step drawn per prompt and shared by its group, the flash_sde kernel
against the Flow-GRPO family, temporal gradient rectification against the kernel's own coefficients (and the
release's table), recipe checks, and two iterations of the shipped world recipe."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import ROOT, tiny_recipe
from flowrl_zoo.flash_grpo import candidate_pool, rectification_weights, step_scales

import flowrl
from flowrl import RecipeError
from flowrl.config.recipe import load_recipe, recipe_from_dict
from flowrl.core.rng import RolloutRNG
from flowrl.core.types import Plan, Schedule, Unit
from flowrl.parts.samplers.walk import TrajectoryRecorder, walk
from flowrl.trainer import Trainer

PROMPTS = ["a red circle", "two blue squares", "a cat", "a dog", "three green stars", "a house"]


TINY = {"type": "tiny_flux", "resolution": 16, "num_layers": 1, "num_single_layers": 1}


def setup(n: int = 8, kernel: dict | None = None) -> tuple:
    backbone = flowrl.build("backbone", TINY)
    schedule = Schedule(backbone.schedule_sigmas(n, 3.0), flowrl.build("kernel", kernel or {"type": "flash_sde"}))
    return backbone, schedule


def window(schedule: Schedule, size: int, start: int = 0) -> Plan:
    selector = flowrl.build("selector", {"type": "flash_window", "start": start, "size": size})
    return selector.plan(schedule, 0, torch.Generator())


def sample(backbone, schedule, plan, prompts, slots, group_size=3, **config):  # type: ignore[no-untyped-def]
    sampler = flowrl.build("sampler", {"type": "iso_temporal", "group_size": group_size, **config})
    with torch.no_grad():
        return sampler.rollout(backbone, prompts, plan, schedule, RolloutRNG(0, 0, slots))


def test_one_sde_step_per_rollout_shared_by_the_group() -> None:
    backbone, schedule = setup()
    plan = window(schedule, 4, start=1)
    assert [u.start for u in plan.units] == [1, 2, 3, 4] and plan.trained == (0, 1, 2, 3)
    before = backbone.nfe
    rollout = sample(backbone, schedule, plan, PROMPTS, range(len(PROMPTS)))
    g, n, r = 3, schedule.num_steps, len(PROMPTS) * 3
    assert rollout.num_rollouts == r and rollout.nfe == backbone.nfe - before == r * n  # N evaluations a rollout
    t = rollout.transitions
    assert len(t) == t.num_inputs == r  # one trained transition per rollout ...
    assert sorted(t.rollout_index.tolist()) == list(range(r))  # ... for every rollout
    k = rollout.extras["sde_step"].value
    sig = schedule.tensor()
    order = t.rollout_index
    assert torch.equal(t.input_s, sig[k[order]]) and torch.equal(t.s_next, sig[k[order] + 1])  # taken at its k
    assert torch.equal(torch.tensor([plan.units[u].start for u in t.unit_index.tolist()]), k[order])
    assert torch.equal(rollout.group, rollout.rollout_prompt)
    per_prompt = k.reshape(len(PROMPTS), g)
    assert bool((per_prompt == per_prompt[:, :1]).all())  # one k per group
    assert bool(((k >= 1) & (k <= 4)).all())  # inside the window
    assert len(set(per_prompt[:, 0].tolist())) > 1  # prompts of one batch differ (6 draws from 4 steps)
    assert bool(torch.isfinite(t.log_prob).all())


def test_each_group_is_the_core_walk_with_its_one_unit() -> None:
    """Every step but k is the Euler ODE step and k the kernel's: prompt p's rollouts equal the core's walk with
    the one-unit plan (k_p), from the same streams (the k draw, then the initial noise, then the step's noise)."""
    backbone, schedule = setup()
    plan = window(schedule, 5)
    rollout = sample(backbone, schedule, plan, PROMPTS[:3], [10, 11, 12])
    k = rollout.extras["sde_step"].value
    cond = backbone.encode(PROMPTS[:3])
    for p in range(3):
        rng = RolloutRNG(0, 0, [10 + p])
        drawn = int(torch.randint(5, (1,), generator=rng.generators[0]))
        assert plan.units[drawn].start == int(k[3 * p])
        rows = torch.zeros(3, dtype=torch.long)
        one = Plan(units=(Unit(int(k[3 * p])),), trained=(0,))
        recorder = TrajectoryRecorder(one, torch.arange(3))
        with torch.no_grad():
            x = rng.randn(rows, backbone.latent_shape)
            x = walk(backbone, x, cond.take(torch.full((3,), p)), rows, 0, one, schedule, rng, recorder)
        mine = rollout.final_latents[3 * p: 3 * p + 3]
        # the same arithmetic on other batch shapes (3 rows against 9, then split): float32 BLAS blocking moves
        # the tiny transformer's output by ~1e-7 of latents of order 1; 1e-5 leaves a wide margin and still
        # fails on any step taken otherwise (an SDE step's noise is of order 0.1)
        assert torch.allclose(mine, x, rtol=1e-5, atol=1e-5)
        theirs = recorder.transitions()
        assert torch.allclose(rollout.transitions.log_prob[rollout.transitions.rollout_index // 3 == p].sort().values,
                              theirs.log_prob.sort().values, rtol=1e-5, atol=1e-5)


def test_the_draw_belongs_to_the_prompt_not_the_batch() -> None:
    """Split over two calls (two processes, or trainer.overlap_chunks) the prompts get the same k and images."""
    backbone, schedule = setup()
    plan = window(schedule, 5)
    whole = sample(backbone, schedule, plan, PROMPTS[:4], range(4))
    first = sample(backbone, schedule, plan, PROMPTS[:2], range(2))
    second = sample(backbone, schedule, plan, PROMPTS[2:4], range(2, 4))
    k = whole.extras["sde_step"].value
    assert torch.equal(k, torch.cat([first.extras["sde_step"].value, second.extras["sde_step"].value]))
    # batch shapes differ (12 rows against 6): float32 rounding only, as above
    assert torch.allclose(whole.final_latents, torch.cat([first.final_latents, second.final_latents]), atol=1e-5)


def test_the_pool_is_the_trained_units() -> None:
    """Untrained units are ODE steps; a plan that trains none gives all-ODE rollouts (for a forward-process loss);
    ``flash_window`` without a size is the first half of the grid."""
    backbone, schedule = setup()
    assert [(u.start, u.merge) for u in window(schedule, 0).units] == [(0, 1), (1, 1), (2, 1), (3, 1)]  # 8 // 2
    assert candidate_pool(Plan(units=(Unit(0), Unit(2), Unit(5)), trained=(1,))) == [1]
    before = backbone.nfe
    odd = sample(backbone, schedule, Plan(units=(Unit(0), Unit(2), Unit(5)), trained=(1,)), PROMPTS[:2], range(2))
    assert odd.extras["sde_step"].value.tolist() == [2] * 6 and len(odd.transitions) == 6
    none = sample(backbone, schedule, Plan(units=(Unit(2),), trained=()), PROMPTS[:2], range(2))
    assert none.extras["sde_step"].value.tolist() == [-1] * 6 and len(none.transitions) == 0
    assert backbone.nfe - before == 2 * 6 * schedule.num_steps
    with pytest.raises(ValueError, match="merges steps"):
        candidate_pool(Plan(units=(Unit(0, 2),), trained=(0,)))


def test_recipes_it_cannot_take_are_refused() -> None:
    data = tiny_recipe()
    data.update(sampler={"type": "iso_temporal", "group_size": 2}, kernel={"type": "flash_sde"},
                selector={"type": "explicit", "units": [[0, 2]]})
    with pytest.raises(RecipeError, match="merged units"):
        recipe_from_dict(data)
    data["selector"] = {"type": "flash_window", "size": 4}  # 4 steps: only 0..2 may be stochastic
    with pytest.raises(RecipeError, match=r"\[selector.size\] the window covers steps 0..3"):
        recipe_from_dict(data)
    data["selector"] = {"type": "flash_window", "size": 3}
    data["kernel"] = {"type": "flash_sde", "s_max": 0.2, "s_min": 0.5}
    with pytest.raises(RecipeError, match=r"\[kernel.s_max\] must be >= s_min"):
        recipe_from_dict(data)


# -- the kernel --------------------------------------------------------------------------------------------------
def test_flash_kernel_is_the_flow_grpo_step_with_a_linear_diffusion() -> None:
    """Where Flow-GRPO's diffusion a sqrt(s / (1 - s)) equals Flash's s_min + (s_max - s_min) s, the two kernels
    give the same Gaussian: one marginal-preserving step, two noise schedules."""
    _, schedule = setup(10)
    flash = flowrl.build("kernel", {"type": "flash_sde", "s_max": 0.9, "s_min": 0.1})
    g = torch.Generator().manual_seed(0)
    x, v = torch.randn((1, 4, 6), generator=g), torch.randn((1, 4, 6), generator=g)
    for i in range(9):
        s, s_next = schedule.sigmas[i], schedule.sigmas[i + 1]
        diffusion = 0.1 + 0.8 * s
        a = diffusion / math.sqrt(s / (1 - s)) if s < 1 else diffusion / math.sqrt(1 / (1 - schedule.s_at_one))
        flow = flowrl.build("kernel", {"type": "flow_grpo_sde", "noise_level": a})
        mean, std = flash.mean_std(x, v, s, s_next, schedule.s_at_one)
        ref_mean, ref_std = flow.mean_std(x, v, s, s_next, schedule.s_at_one)
        # coefficients formed in float64 from a in two ways, applied in float32: agreement to float32 rounding
        assert torch.allclose(mean, ref_mean, rtol=1e-6, atol=1e-6)
        assert math.isclose(float(std), diffusion * math.sqrt(s - s_next), rel_tol=1e-6)
        assert torch.allclose(std, ref_std, rtol=1e-6)


def test_flash_kernel_defaults_to_the_grid_and_zero_noise_is_the_ode_step() -> None:
    _, schedule = setup(20)
    kernel, s1 = schedule.kernel, schedule.s_at_one
    for i in (0, 7, 18):
        s, s_next = schedule.sigmas[i], schedule.sigmas[i + 1]
        std = kernel.std_only(s, s_next, s1)
        assert math.isclose(float(std), s1 * s * math.sqrt(s - s_next), rel_tol=1e-6)  # s_max = s_1, s_min = 0
    still = flowrl.build("kernel", {"type": "flash_sde", "s_max": 0.0})
    x, v = torch.randn((2, 5)), torch.randn((2, 5))
    mean, std = still.mean_std(x, v, 0.6, 0.5, s1)
    assert float(std.abs().max()) == 0.0 and torch.allclose(mean, x - 0.1 * v, atol=1e-6)


# -- temporal gradient rectification -----------------------------------------------------------------------------
def finite_difference_scale(kernel, s: float, s_next: float, s_at_one: float) -> float:  # type: ignore[no-untyped-def]
    """``std / |b|`` with ``b = d mean / d v`` by a central difference (the mean is linear in v: exact up to
    float32 rounding), independent of the autograd route the sampler takes."""
    x = torch.zeros((1, 1))
    up, std = kernel.mean_std(x, torch.ones((1, 1)), s, s_next, s_at_one)
    down, _ = kernel.mean_std(x, -torch.ones((1, 1)), s, s_next, s_at_one)
    return float(std) / abs(float(up - down) / 2)


@pytest.mark.parametrize("kernel", [
    {"type": "flash_sde"}, {"type": "flow_grpo_sde", "noise_level": 0.7}, {"type": "dance_grpo_sde", "eta": 0.3},
    {"type": "cps", "noise_level": 0.7},
])
def test_rectification_weights_are_std_over_the_v_coefficient(kernel: dict) -> None:
    _, schedule = setup(16, kernel)
    pool = list(range(8))
    w = rectification_weights(schedule, pool)
    assert math.isclose(float(w.double().mean()), 1.0, rel_tol=1e-6)  # mean 1 over the pool (float32 weights)
    expected = [finite_difference_scale(schedule.kernel, schedule.sigmas[i], schedule.sigmas[i + 1],
                                        schedule.s_at_one) for i in pool]
    ratios = [float(w[i] / w[0]) for i in pool]
    # float32 means and stds (relative rounding ~1e-7 each): 1e-5 covers it; a wrong formula moves the ratios by
    # far more (weighting by the std alone, TempFlow's, is off by 2x over these steps for flash_sde)
    assert ratios == pytest.approx([e / expected[0] for e in expected], rel=1e-5)
    assert len({round(r, 3) for r in ratios}) > 1  # the steps really differ


def test_rectification_matches_the_release_table() -> None:
    """The release hard-codes 1 / c for its 10 candidate steps of the 20-step, shift-3 Wan grid (7.4770 at t = 999
    down to 3.7754 at t = 785) and normalises by their mean. Wan's scheduler starts its grid at 0.9997 where
    flowrl's starts at 1, which moves every 1 / c by 0.087% to 0.100%: the normalised weights agree to 1e-4."""
    table = torch.tensor([7.4770, 7.0414, 6.6112, 6.1867, 5.7682, 5.3559, 4.9502, 4.5513, 4.1596, 3.7754])
    _, schedule = setup(20)
    scales = 1.0 / step_scales(schedule, range(10))
    assert torch.allclose(scales.float(), table, rtol=1.5e-3)
    assert torch.allclose(rectification_weights(schedule, range(10)), table / table.mean(), rtol=1e-4)


def test_each_transition_carries_its_step_weight() -> None:
    backbone, schedule = setup()
    plan = window(schedule, 5)
    w = rectification_weights(schedule, range(5))
    on = sample(backbone, schedule, plan, PROMPTS, range(len(PROMPTS)))
    off = sample(backbone, schedule, plan, PROMPTS, range(len(PROMPTS)), rectification=False)
    assert torch.equal(on.transitions.weight, w[on.transitions.unit_index])
    assert torch.equal(off.transitions.weight, torch.ones(len(off.transitions)))
    assert torch.equal(on.images, off.images)  # the weights change the loss, not the rollouts


# -- the shipped recipe --------------------------------------------------------------------------------------------
def test_world_recipe_trains(tmp_path: Path) -> None:
    small = ["trainer.max_steps=2", "trainer.prompts_per_step=2", "trainer.eval_every=0", "trainer.image_every=0",
             "trainer.checkpoint_every=0", "trainer.max_minutes=0"]
    recipe = load_recipe(ROOT / "recipes" / "flash_grpo.toml", small)
    trainer = Trainer(recipe, tmp_path / "run", quiet=True)
    initial = {n: p.detach().clone() for n, p in trainer.named_params}
    trainer.run()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[-1]["nfe"] == 2 * 2 * 8 * 10  # 2 iterations x 2 prompts x 8 rollouts x 10 steps
    for row in rows:
        assert math.isfinite(row["loss"]) and row["skipped_steps"] == 0
        assert row["ratio_mean"] == pytest.approx(1.0, abs=1e-5)  # on-policy first epoch
        if "update/backward_rows" in row:  # trainer.update = auto kept the rollout's graphs: 16 trained inputs
            assert row["update/backward_rows"] == 16 and row["update/recomputed_rows"] == 0
    assert any(not torch.equal(p.detach(), initial[n]) for n, p in trainer.named_params)
