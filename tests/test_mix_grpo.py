"""MixGRPO: the sliding-window strategies and their checkpointed state, the Flash sampler's second-order ODE
tail (DPM-Solver++ 2M) and its NFE, equivalence with Flow-GRPO for a full window, and the recipes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import shipped_tiny, tiny_recipe
from flowrl_zoo.mix_grpo import MixGRPOWindow

import flowrl
from flowrl import RecipeError
from flowrl.config.recipe import recipe_from_dict
from flowrl.core.rng import RolloutRNG
from flowrl.core.schedule import shifted_sigmas
from flowrl.core.types import Plan, Schedule, Unit
from flowrl.parts.samplers.solvers import coarse_grid, solve
from flowrl.trainer import Trainer

TINY = ["sampler.group_size=2"]


def schedule(n: int) -> Schedule:
    kernel = flowrl.build("kernel", {"type": "flow_grpo_sde", "noise_level": 0.7})
    return Schedule(tuple(float(s) for s in shifted_sigmas(n, 3.0)), kernel)


def window(**config: object) -> MixGRPOWindow:
    return flowrl.build("selector", {"type": "mix_grpo_window", **config})


def starts(selector: MixGRPOWindow, n: int, iterations: int, seed: int = 0) -> list[int]:
    out = []
    for k in range(iterations):
        plan = selector.plan(schedule(n), k, torch.Generator().manual_seed(seed + k))
        assert plan.trained == tuple(range(len(plan.units)))  # the window is trained, nothing else is SDE
        steps = [u.start for u in plan.units]
        assert all(u.merge == 1 for u in plan.units) and steps == list(range(steps[0], steps[0] + len(steps)))
        out.append(steps[0])
    return out


# -- the window ---------------------------------------------------------------------------------------------
def test_progressive_moves_every_tau_and_wraps_around() -> None:
    got = starts(window(window_size=4, shift_every=2), n=10, iterations=16)
    assert got == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 0, 0]  # starts 0..N-w, then back to 0


def test_stride_sets_the_overlap() -> None:
    # stride 1: consecutive windows share w - 1 steps; stride = w: disjoint windows tiling the range.
    assert starts(window(window_size=4, shift_every=1, stride=4), n=12, iterations=4) == [0, 4, 8, 0]
    assert starts(window(window_size=4, shift_every=1, stride=3), n=12, iterations=5) == [0, 3, 6, 0, 3]
    # span: the window stays within the first ceil(span N) steps.
    assert starts(window(window_size=2, shift_every=1, span=0.5), n=8, iterations=4) == [0, 1, 2, 0]


@pytest.mark.parametrize(
    ("strategy", "holds"),
    [
        ("progressive", [10, 10, 10, 10]),
        ("decay", [10, 8, 6, 4]),  # ceil(10 (1 - 0.2 l))
        ("exp_decay", [10, 9, 7, 6]),  # ceil(10 exp(-0.2 l))
    ],
)
def test_hold_times_of_the_strategies(strategy: str, holds: list[int]) -> None:
    selector = window(window_size=2, strategy=strategy, shift_every=10, decay=0.2)
    got = starts(selector, n=8, iterations=sum(holds) + 1)
    assert [got.count(position) for position in range(4)] == holds
    assert got[-1] == 4
    assert selector.hold(20) == (10 if strategy == "progressive" else 1)  # never below min_shift_every


def test_random_and_frozen_strategies() -> None:
    got = starts(window(window_size=3, strategy="random"), n=10, iterations=40)
    assert set(got) <= set(range(8)) and len(set(got)) > 3
    assert got == starts(window(window_size=3, strategy="random"), n=10, iterations=40)  # from the generator
    assert set(starts(window(window_size=3, strategy="frozen", start=2, shift_every=1), n=10, iterations=5)) == {2}


def test_checkpoint_restore_reproduces_the_next_plan(tmp_path: Path) -> None:
    config = {"window_size": 3, "strategy": "decay", "shift_every": 3, "decay": 0.3}
    first = window(**config)
    plans = [first.plan(schedule(10), k, torch.Generator()) for k in range(7)]
    torch.save(first.state_dict(), tmp_path / "state.pt")
    restored = window(**config)
    restored.load_state_dict(torch.load(tmp_path / "state.pt"))
    assert restored.state_dict() == first.state_dict()
    for k in range(7, 12):
        expected = first.plan(schedule(10), k, torch.Generator()).units
        assert restored.plan(schedule(10), k, torch.Generator()).units == expected
    assert plans[0].units[0].start == 0
    # The saved position is what the selector continues from (not a replay from iteration 0).
    moved = window(**config)
    moved.load_state_dict({"iteration": 6, "position": 1, "held": 1})  # a replay would be at 2
    assert moved.plan(schedule(10), 7, torch.Generator()).units[0] == Unit(1)


def test_window_that_does_not_fit_is_a_recipe_error() -> None:
    data = tiny_recipe()
    data["selector"] = {"type": "mix_grpo_window", "window_size": 6}
    with pytest.raises(RecipeError, match=r"\[selector.window_size\] a window of 6 steps does not fit in 4 steps"):
        recipe_from_dict(data)


# -- Flash: the second-order ODE tail -------------------------------------------------------------------------
MU, C = 0.7, 0.5


def gaussian_velocity(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """The exact flow-matching velocity for data N(MU, C^2): v = (x - E[x0 | x_s]) / s."""
    s = float(s)
    var = (1 - s) ** 2 * C**2 + s**2
    return (x - (MU + (1 - s) * C**2 / var * (x - (1 - s) * MU))) / s


def gaussian_state(s: float, z: torch.Tensor) -> torch.Tensor:
    """The exact ODE solution at level s of the trajectory that starts at x_1 = z."""
    return (1 - s) * MU + math.sqrt((1 - s) ** 2 * C**2 + s**2) * z


def test_dpm_solver_is_exact_for_a_constant_data_prediction() -> None:
    target = torch.tensor([0.3, -1.2, 2.0])  # data = one point: x0_hat is constant, trajectories are lines
    z = torch.tensor([1.0, -0.5, 0.25])
    sigmas = shifted_sigmas(5, 3.0).float()
    for solver in ("euler", "dpm_solver_2m"):
        out = solve(solver, lambda x, s: (x - target) / s, z, sigmas)
        assert torch.allclose(out, target, atol=1e-6)


def test_dpm_solver_is_second_order_on_an_analytic_field() -> None:
    z = torch.linspace(-2, 2, 41, dtype=torch.float64)
    a, b = 0.8, 0.1
    errors: dict[str, list[float]] = {"euler": [], "dpm_solver_2m": []}
    for solver, errs in errors.items():
        for n in (16, 32, 64):
            out = solve(solver, gaussian_velocity, gaussian_state(a, z), torch.linspace(a, b, n + 1))
            errs.append(float((out - gaussian_state(b, z)).abs().max()))
    euler, dpm = errors["euler"], errors["dpm_solver_2m"]
    assert all(1.8 < p / q < 2.2 for p, q in zip(euler, euler[1:], strict=False))  # first order
    assert all(3.5 < p / q < 4.5 for p, q in zip(dpm, dpm[1:], strict=False))  # second order
    assert dpm[0] < euler[0] / 5


def test_dpm_tail_on_the_tiny_model_is_closer_to_the_fine_reference() -> None:
    backbone = flowrl.build("backbone", {"type": "tiny_flux", "resolution": 16})
    cond = backbone.encode(["a red circle", "two blue squares"])
    x = torch.randn((2, *backbone.latent_shape), generator=torch.Generator().manual_seed(0))

    def velocity(latents: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return backbone.velocity(latents, s.expand(latents.shape[0]), cond)

    with torch.no_grad():
        reference = solve("euler", velocity, x, shifted_sigmas(64, 3.0).float())
        nfe = backbone.nfe
        dpm = solve("dpm_solver_2m", velocity, x, shifted_sigmas(8, 3.0).float())
        assert backbone.nfe - nfe == 2 * 8  # one evaluation per row per interval
        euler = solve("euler", velocity, x, shifted_sigmas(8, 3.0).float())
    assert (dpm - reference).norm() < 0.8 * (euler - reference).norm()


def flash_setup(**sampler: object) -> tuple:
    backbone = flowrl.build("backbone", {"type": "tiny_flux", "resolution": 16})
    flash = flowrl.build("sampler", {"type": "mix_grpo_flash", "group_size": 3, **sampler})
    plain = flowrl.build("sampler", {"type": "independent", "group_size": 3})
    plan = Plan(units=(Unit(1), Unit(2), Unit(3)), trained=(0, 1, 2))
    return backbone, flash, plain, schedule(10), plan


def test_flash_with_euler_on_the_full_grid_is_the_independent_sampler() -> None:
    backbone, flash, plain, sched, plan = flash_setup(tail_solver="euler", tail_steps=0)
    with torch.no_grad():
        a = flash.rollout(backbone, ["a", "b"], plan, sched, RolloutRNG(0, 0, [0, 1]))
        b = plain.rollout(backbone, ["a", "b"], plan, sched, RolloutRNG(0, 0, [0, 1]))
    # exact: the same draws through the same walk, forwards on the same batches
    assert torch.equal(a.images, b.images) and a.nfe == b.nfe == 6 * 10
    assert torch.equal(a.transitions.log_prob, b.transitions.log_prob)
    assert torch.equal(a.transitions.x_next, b.transitions.x_next)


def test_flash_tail_costs_fewer_evaluations_counted_honestly() -> None:
    backbone, flash, plain, sched, plan = flash_setup(tail_solver="dpm_solver_2m", tail_steps=2)
    assert coarse_grid(10, 4, 2) == [4, 7, 10] and coarse_grid(10, 4, 0) == list(range(4, 11))
    before = backbone.nfe
    with torch.no_grad():
        rollout = flash.rollout(backbone, ["a", "b"], plan, sched, RolloutRNG(0, 0, [0, 1]))
    rows = 2 * 3
    assert rollout.nfe == backbone.nfe - before == rows * (4 + 2)  # window end 4, then two tail intervals
    assert len(rollout.transitions) == rows * 3 and rollout.final_latents is not None
    assert torch.isfinite(rollout.images).all()


# -- equivalence with Flow-GRPO and the recipes ---------------------------------------------------------------
def run(data: dict, folder: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    trainer = Trainer(recipe_from_dict(data), folder, quiet=True)
    trainer.run()
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return rows[-1], {n: p.detach().clone() for n, p in trainer.named_params}


def test_full_window_equals_flow_grpo(tmp_path: Path) -> None:
    """A window covering every step is Flow-GRPO with train_fraction 1.0: same loss, same updated weights."""
    flow = tiny_recipe(max_steps=2)
    flow["selector"] = {"type": "flow_grpo_prefix", "train_fraction": 1.0}
    mix = tiny_recipe(max_steps=2)
    mix["selector"] = {"type": "mix_grpo_window", "window_size": 4, "strategy": "progressive", "shift_every": 1}
    row_flow, weights_flow = run(flow, tmp_path / "flow")
    row_mix, weights_mix = run(mix, tmp_path / "mix")
    for key in ("loss", "reward/total", "nfe", "ratio_mean", "grad_norm"):
        assert row_mix[key] == row_flow[key]  # bit-identical (same plan, same draws, same arithmetic)
    assert all(torch.equal(weights_mix[n], weights_flow[n]) for n in weights_flow)
    fresh = dict(recipe_from_dict(flow).build("backbone").transformer.named_parameters())
    assert any(not torch.equal(fresh[n], w) for n, w in weights_flow.items())  # the update did something


@pytest.mark.parametrize("name", ["mix_grpo", "mix_grpo_flash"])
def test_recipe_runs_two_iterations(name: str, tmp_path: Path) -> None:
    recipe = shipped_tiny(name, TINY)
    trainer = Trainer(recipe, tmp_path / name, quiet=True)
    trainer.run()
    rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(math.isfinite(r["loss"]) for r in rows)
    assert trainer.selector.state_dict()["iteration"] == 1
    extra = torch.load(next((tmp_path / name / "checkpoints").glob("step_*")) / "extra.pt", weights_only=False)
    assert extra["components"]["selector"] == trainer.selector.state_dict()
