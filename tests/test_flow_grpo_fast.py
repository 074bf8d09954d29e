"""Flow-GRPO-Fast: a random 2-3 step SDE window inside the first half, ODE elsewhere, only the window trained."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import shipped_tiny, tiny_recipe

import flowrl
from flowrl import RecipeError
from flowrl.config.recipe import recipe_from_dict
from flowrl.core.rng import RolloutRNG
from flowrl.core.schedule import shifted_sigmas
from flowrl.core.types import Schedule
from flowrl.trainer import Trainer


def schedule(n: int) -> Schedule:
    return Schedule(tuple(float(s) for s in shifted_sigmas(n, 3.0)), flowrl.build("kernel", {"type": "flow_grpo_sde"}))


def windows(n: int, draws: int, **config: object) -> list[tuple[int, ...]]:
    selector = flowrl.build("selector", {"type": "flow_grpo_fast_window", **config})
    out = []
    for k in range(draws):
        plan = selector.plan(schedule(n), k, torch.Generator().manual_seed(k))
        steps = tuple(u.start for u in plan.units)
        assert all(u.merge == 1 for u in plan.units) and plan.trained == tuple(range(len(steps)))
        assert steps == tuple(range(steps[0], steps[0] + len(steps)))  # one contiguous window
        out.append(steps)
    return out


def test_window_is_two_or_three_steps_in_the_first_half() -> None:
    got = windows(10, 60)
    assert {len(w) for w in got} == {2, 3}
    assert all(w[-1] < 5 for w in got)  # inside steps 0..4
    assert len({w[0] for w in got}) >= 3  # the position varies
    assert got == windows(10, 60)  # drawn from the plan generator only
    later = windows(10, 30, min_size=2, max_size=2, range_start=0.3, range_end=0.8)
    assert all(len(w) == 2 and w[0] >= 3 and w[-1] < 8 for w in later)


def test_window_must_fit_in_the_range() -> None:
    data = tiny_recipe()  # 4 steps: the first half has 2, too few for a 3-step window
    data["selector"] = {"type": "flow_grpo_fast_window"}
    with pytest.raises(RecipeError, match=r"\[selector.max_size\] a window of 3 steps does not fit"):
        recipe_from_dict(data)
    data["selector"] = {"type": "flow_grpo_fast_window", "min_size": 3, "max_size": 2}
    with pytest.raises(RecipeError, match="max_size must be >= min_size"):
        recipe_from_dict(data)


def test_only_the_window_is_stochastic_and_recorded() -> None:
    backbone = flowrl.build("backbone", {"type": "tiny_flux", "resolution": 16})
    sampler = flowrl.build("sampler", {"type": "independent", "group_size": 3})
    selector = flowrl.build("selector", {"type": "flow_grpo_fast_window"})
    plan = selector.plan(schedule(10), 0, torch.Generator().manual_seed(3))
    with torch.no_grad():
        rollout = sampler.rollout(backbone, ["a"], plan, schedule(10), RolloutRNG(0, 0, [0]))
    t = rollout.transitions
    window = [u.start for u in plan.units]
    assert len(t) == 3 * len(window) and rollout.nfe == 3 * 10
    sigmas = torch.tensor(schedule(10).sigmas, dtype=torch.float32)
    assert torch.equal(t.input_s.unique(), sigmas[window].unique())


def test_recipe_runs_two_iterations(tmp_path: Path) -> None:
    overrides = ["sampler.group_size=2"]
    recipe = shipped_tiny("flow_grpo_fast", overrides)
    assert recipe.parts["loss"].config.clip_range == 1e-5
    Trainer(recipe, tmp_path / "run", quiet=True).run()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["nfe"] for r in rows] == [2 * 2 * 10, 2 * 2 * 2 * 10]
    assert all(math.isfinite(r["loss"]) and abs(r["ratio_mean"] - 1) < 1e-5 for r in rows[:1])
