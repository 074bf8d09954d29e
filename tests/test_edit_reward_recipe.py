"""recipes/flux/kontext_edit_judge.toml with its model and prompts swapped for the tiny FLUX.1-Kontext twin and the
embedded world's edits and its judge for a stand-in served on 127.0.0.1: the two edit rewards train together, the
preservation weight follows its schedule, and the checkpoint records which judge scored."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import torch
from conftest import ROOT
from served import edit_judge_app, in_thread, judge_answer

from flowrl.config.recipe import recipe_from_dict
from flowrl.config.reward_weights import weight_at
from flowrl.trainer import train

RECIPE = ROOT / "recipes" / "flux" / "kontext_edit_judge.toml"


def test_the_preservation_weight_ramps_in_as_the_recipe_says() -> None:
    data = tomllib.loads(RECIPE.read_text())
    recipe = recipe_from_dict(data, source=str(RECIPE))
    judge, preserve = (r.weight for r in recipe.rewards)
    assert [weight_at(judge, k) for k in (0, 50, 299)] == [1.0, 1.0, 1.0]
    # held at 0 up to iteration 20, then a line to 0.5 at iteration 100 (float: a relative 1e-12)
    assert [weight_at(preserve, k) for k in (0, 20, 60, 100, 299)] == pytest.approx([0, 0, 0.25, 0.5, 0.5], rel=1e-12)


def test_it_trains_on_the_tiny_kontext_twin_and_the_checkpoint_names_the_judge(tmp_path: Path) -> None:
    app = edit_judge_app(lambda body: judge_answer('{"score": [8, 6]}', alternatives={0: {"8": 0.5, "7": 0.5}}),
                         lambda body: judge_answer('{"score": [9, 7]}'), models=("judge-7b",))
    data = tomllib.loads(RECIPE.read_text())
    data["backbone"] = {"type": "tiny_flux_kontext", "resolution": 32}
    data["prompts"] = {"type": "world_edit"}
    data["schedule"] = {"num_steps": 4, "shift": 3.0}
    data["sampler"]["group_size"] = 4
    data["reward"][1]["weight"] = {"schedule": "linear", "start": 0.0, "end": 0.5, "steps": 2, "warmup": 1}
    data["lora"] = {"rank": 4, "alpha": 8.0}
    data["trainer"] = {"max_steps": 3, "prompts_per_step": 2, "train_batch_size": 8, "eval_every": 0,
                       "checkpoint_every": 0, "image_every": 0, "torch_threads": 1}
    with in_thread(app) as server:
        data["reward"][0]["url"] = server.url
        run = tmp_path / "run"
        train(recipe_from_dict(data, source=f"{RECIPE} (tiny)"), run, quiet=True)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "reward/judge" in r]
    assert len(rows) == 3
    # the stand-in answers alike for every image: SC = min(7.5, 6) / 10, PQ = 0.7
    assert rows[0]["reward/judge"] == pytest.approx((0.6 * 0.7) ** 0.5, rel=1e-6)
    assert all(-1 <= r["reward/preserve"] <= 1 for r in rows)
    weights = [r.get("reward_weight/preserve") for r in rows]
    assert weights == pytest.approx([0.0, 0.0, 0.5], rel=1e-12), weights
    (checkpoint,) = sorted((run / "checkpoints").iterdir())  # the one at the end
    extra = torch.load(checkpoint / "extra.pt", weights_only=False)
    assert extra["components"]["reward/judge"] == {"judge": {"url": server.url, "model": "judge-7b",
                                                             "answered_by": ["judge-7b"]}}
