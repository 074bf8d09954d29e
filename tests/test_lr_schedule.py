"""The learning-rate schedule: warm-up, then constant, linear or cosine decay to optim.final_lr_ratio."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flowrl.utils.lr_schedule import lr_factor


@given(st.integers(0, 50), st.integers(1, 500), st.sampled_from(["linear", "cosine"]), st.floats(0, 1))
def test_decay_runs_from_one_to_the_floor_without_rising(warmup: int, steps: int, decay: str, floor: float) -> None:
    factors = [lr_factor(k, warmup, decay, warmup + steps, floor) for k in range(warmup + steps + 3)]
    assert factors[:warmup] == [(k + 1) / warmup for k in range(warmup)]
    after = factors[warmup:]
    assert math.isclose(after[0], 1.0) and math.isclose(after[steps], floor, abs_tol=1e-12)
    assert all(b <= a + 1e-12 for a, b in zip(after, after[1:], strict=False))
    assert all(f == after[steps] for f in after[steps:])  # the floor after the horizon


@pytest.mark.parametrize(("decay", "half"), [("linear", 0.55), ("cosine", 0.55), ("constant", 1.0)])
def test_halfway(decay: str, half: float) -> None:
    """Half way to the horizon, floor 0.1: linear and cosine both at 0.1 + 0.9 / 2."""
    assert math.isclose(lr_factor(50, 0, decay, 100, 0.1), half)


def test_a_run_decays_to_the_floor(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The trainer's LR follows optim.lr_decay over trainer.max_steps (the logged lr is the next step's)."""
    import json

    from conftest import tiny_recipe

    from flowrl.config.recipe import recipe_from_dict
    from flowrl.trainer import train

    data = tiny_recipe(max_steps=3)
    data["optim"] = {"lr": 1e-4, "lr_decay": "linear", "final_lr_ratio": 0.25}
    run = train(recipe_from_dict(data), tmp_path / "run", quiet=True)
    lrs = [json.loads(line)["lr"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert lrs == pytest.approx([1e-4 * (0.25 + 0.75 * (1 - k / 3)) for k in (1, 2, 3)], rel=1e-9)
