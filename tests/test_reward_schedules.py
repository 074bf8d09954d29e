"""``[[reward]] weight`` as a schedule over the iterations (flowrl.config.reward_weights, docs/rewards.md): the
shapes, the recipe's checks, a number weight unchanged, the logged weight and an exact resume."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import tiny_recipe
from test_advantages import _rollout

from flowrl import RecipeError
from flowrl.config.recipe import recipe_from_dict
from flowrl.config.reward_weights import WeightSchedule, describe_weight, weight_at
from flowrl.trainer import Trainer, train
from flowrl.trainer.rewards import RewardPhase, reward_models
from flowrl.utils.lr_schedule import lr_factor


def schedule(**kw: Any) -> WeightSchedule:
    return WeightSchedule(**kw)


def with_weight(weight: Any, **trainer: Any) -> dict:
    data = tiny_recipe(**trainer)
    data["reward"] = [{"type": "jpeg_compressibility", "scale_kb": 1.0, "name": "jpeg", "weight": weight}]
    return data


def problems(weight: Any, second: bool = False) -> list[tuple[str, str]]:
    data = with_weight(weight)
    if second:  # two rewards: the loader names them reward[0], reward[1]
        data["reward"] = [{"type": "jpeg_compressibility", "name": "a"}, {**data["reward"][0], "name": "b"}]
    with pytest.raises(RecipeError) as caught:
        recipe_from_dict(data)
    report = str(caught.value).splitlines()
    assert len(report) == 1 + len(caught.value.problems)  # one line per problem
    return caught.value.problems


# -- the shapes -----------------------------------------------------------------------------------------------
def test_linear_is_exact_on_a_binary_grid_and_holds_its_warmup() -> None:
    s = schedule(schedule="linear", start=0.0, end=1.0, steps=4)
    assert [weight_at(s, k) for k in range(7)] == [0.0, 0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    held = schedule(schedule="linear", start=2.0, end=0.0, steps=6, warmup=2)
    assert [weight_at(held, k) for k in range(8)] == [2.0, 2.0, 2.0, 1.5, 1.0, 0.5, 0.0, 0.0]


def test_cosine_starts_and_ends_exactly_and_follows_the_half_cosine() -> None:
    s = schedule(schedule="cosine", start=1.0, end=0.2, steps=10, warmup=4)
    assert weight_at(s, 0) == weight_at(s, 4) == 1.0  # held through the warm-up, exact
    assert weight_at(s, 10) == weight_at(s, 50) == 0.2  # cos(pi) is -1 in floating point: exact
    for k in (5, 7, 9):
        expected = 0.2 + 0.8 * 0.5 * (1 + math.cos(math.pi * (k - 4) / 6))
        assert weight_at(s, k) == pytest.approx(expected, rel=1e-12)
    assert weight_at(s, 7) == pytest.approx(0.6, rel=1e-12)  # half way: the mean of start and end
    # the same shape as the learning rate's decay, mapped from (1 -> 0) onto (start -> end)
    assert weight_at(s, 8) == pytest.approx(0.2 + 0.8 * lr_factor(4, 0, "cosine", 6, 0.0), rel=1e-15)


def test_step_constant_and_a_number() -> None:
    s = schedule(schedule="step", start=0.0, end=3.0, at=2)
    assert [weight_at(s, k) for k in range(5)] == [0.0, 0.0, 3.0, 3.0, 3.0]
    assert [weight_at(schedule(schedule="constant", start=0.7), k) for k in (0, 9, 10_000)] == [0.7, 0.7, 0.7]
    assert [weight_at(2.5, k) for k in (0, 3)] == [2.5, 2.5]
    assert describe_weight(2.5) == "2.5"
    assert describe_weight(schedule(schedule="step", start=0.0, end=3.0, at=2)) == "0, 3 from iteration 2"


# -- the recipe -----------------------------------------------------------------------------------------------
def test_a_schedule_table_loads_and_round_trips() -> None:
    table = {"schedule": "linear", "start": 0, "end": 1.0, "steps": 200, "warmup": 10}
    recipe = recipe_from_dict(with_weight(table))
    assert recipe.rewards[0].weight == schedule(schedule="linear", start=0.0, end=1.0, steps=200, warmup=10)
    import tomllib

    again = recipe_from_dict(tomllib.loads(recipe.to_toml()))
    assert again.rewards == recipe.rewards and again.to_toml() == recipe.to_toml()
    assert tomllib.loads(recipe.to_toml())["reward"][0]["weight"] == {**table, "start": 0.0}


@pytest.mark.parametrize(
    ("weight", "second", "expected"),
    [
        ({"schedule": "linear", "start": 0.0, "end": 1.0}, False, [("reward.weight.steps", "missing required key")]),
        ({"schedule": "ramp", "start": 0.0}, False, [("reward.weight.schedule", "expected one of")]),
        ({"schedule": "step", "start": 0.0, "end": 1.0, "at": 5, "steps": 9}, True,
         [("reward[1].weight.steps", "not used by the 'step' schedule")]),
        ({"schedule": "cosine", "start": 0.0, "end": 1.0, "steps": 5, "warmup": 5}, False,
         [("reward.weight.warmup", "must be below steps (5)")]),
        ({"schedule": "linear", "start": 0.0, "end": 1.0, "steps": 0}, False, [("reward.weight.steps", ">= 1")]),
        ({"schedule": "step", "start": 0.0, "end": 1.0, "at": 3, "stpes": 1}, False,
         [("reward.weight.stpes", "unknown key")]),
        ({"schedule": "step", "start": "low", "end": 1.0, "at": 3}, False,
         [("reward.weight.start", "expected a number")]),
        ({"start": 1.0}, False, [("reward.weight.schedule", "missing required key")]),
        ("half", False, [("reward.weight", "expected a finite number or a schedule table")]),
        (float("nan"), False, [("reward.weight", "expected a finite number, got nan")]),
    ],
)
def test_bad_weights_are_named_by_their_key(weight: Any, second: bool, expected: list[tuple[str, str]]) -> None:
    found = problems(weight, second)
    assert [path for path, _ in found] == [path for path, _ in expected]
    for (_, message), (_, part) in zip(found, expected, strict=True):
        assert part in message


def test_a_number_weight_is_as_before() -> None:
    recipe = recipe_from_dict(with_weight(2.5))
    assert recipe.rewards[0].weight == 2.5 and isinstance(recipe.rewards[0].weight, float)
    assert 'weight = 2.5\nname = "jpeg"' in recipe.to_toml()  # the resolved recipe writes the number as before
    phase = RewardPhase(recipe)
    assert [(r.name, r.weight, r.schedule) for r in phase.rewards] == [("jpeg", 2.5, None)]
    rollout = _rollout([0, 0, 1, 1])
    batches = [phase(rollout, NoPrecomputed(), step) for step in (0, 1, 1000)]
    assert all(batch.weights == {"jpeg": 2.5} for batch in batches)
    assert phase.weight_figures(batches[0]) == {}  # only a scheduled weight is logged


def test_the_weights_of_a_step_and_their_figures() -> None:
    recipe = recipe_from_dict(with_weight({"schedule": "step", "start": 0.0, "end": 1.0, "at": 3}))
    phase = RewardPhase(recipe)
    rollout = _rollout([0, 0, 1, 1])
    batches = [phase(rollout, NoPrecomputed(), step) for step in range(5)]
    assert [b.weights["jpeg"] for b in batches] == [0.0, 0.0, 0.0, 1.0, 1.0]
    assert phase.weight_figures(batches[4]) == {"reward_weight/jpeg": 1.0}
    torch.testing.assert_close(batches[4].total, batches[4].scores["jpeg"])
    assert [r.weight for r in reward_models(recipe, 7)] == [1.0]  # a checkpoint's step (flowrl eval, profile)


class NoPrecomputed:
    """A sampler that scored nothing while it ran."""

    def precomputed_scores(self, name: str, images: torch.Tensor) -> None:
        return None


# -- the loop ------------------------------------------------------------------------------------------------
def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_the_loop_logs_the_weight_of_each_iteration_and_resumes_exactly(tmp_path: Path) -> None:
    weight = {"schedule": "linear", "start": 0.5, "end": 2.0, "steps": 3}
    expected = [weight_at(recipe_from_dict(with_weight(weight)).rewards[0].weight, k) for k in range(4)]
    assert expected == [0.5, 1.0, 1.5, 2.0]
    full = train(recipe_from_dict(with_weight(weight, max_steps=4, eval_every=0)), tmp_path / "full", quiet=True)
    part = train(recipe_from_dict(with_weight(weight, max_steps=2, eval_every=0)), tmp_path / "part", quiet=True)
    resumed = train(recipe_from_dict(with_weight(weight, max_steps=4, eval_every=0)), part, resume=part, quiet=True)
    a, b = _metrics(full), _metrics(resumed)
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3, 4]
    # row k is iteration k-1 (steps count finished iterations): its weight is the schedule's at k-1
    assert [r["reward_weight/jpeg"] for r in a] == expected
    assert [r["reward_weight/jpeg"] for r in b] == expected
    assert [r["reward/total"] for r in a] == [r["reward/total"] for r in b]
    for row in a:  # the total is the weighted score of that iteration
        assert row["reward/total"] == pytest.approx(row["reward_weight/jpeg"] * row["reward/jpeg"], rel=1e-5)
    changed = with_weight({**weight, "end": 3.0}, max_steps=5, eval_every=0)  # another schedule: another method
    with pytest.raises(RecipeError, match="reward"):
        Trainer(recipe_from_dict(changed), part, resume=part, quiet=True)


def test_a_model_card_describes_a_scheduled_weight() -> None:
    from flowrl.export.card import model_card
    from flowrl.export.facts import CardFacts

    linear = schedule(schedule="linear", start=0.0, end=1.0, steps=200, warmup=20)
    facts = CardFacts(
        name="r", base="owner/base", base_is_hub_id=True, licence="mit", licence_note="MIT.", parts={},
        rewards=(("jpeg", 0.5), ("hps", linear)), step=3, iterations=3, nfe=10, eval_steps=4, figures=(), lora=True,
        full_weights=False, pipeline_class="FluxPipeline", transformer_class="FluxTransformer2DModel", video=False,
        sample_prompts=(), sample_file="", loader="diffusers", base_ref="owner/base", example_prompt="a cat")
    card = model_card(facts)
    assert "`jpeg` (weight 0.5), `hps` (weight linear 0 -> 1 after 20 by iteration 200)" in card
