"""recipes/edit/: each is its text-to-image twin in recipes/ with the edit base, the edit prompts and the edit
reward; every method part is the twin's, unchanged, and each trains an iteration on the edit world."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT

from flowrl.config.condition_checks import reward_condition_problems
from flowrl.config.recipe import load_recipe
from flowrl.trainer import train

EDIT = sorted((ROOT / "recipes" / "edit").glob("*.toml"))
METHOD = ("selector", "sampler", "kernel", "advantage", "loss")
ONE_ITERATION = ["trainer.max_steps=1", "trainer.prompts_per_step=2", "trainer.eval_every=1", "trainer.eval_prompts=5",
                 "trainer.image_every=0", "trainer.checkpoint_every=0", "trainer.max_minutes=0", "prompts.eval_count=5"]


def test_the_edit_recipes_are_the_five_methods() -> None:
    assert [p.stem for p in EDIT] == ["aegpo", "dance_grpo", "diffusion_nft", "egrpo", "flow_grpo"]


@pytest.mark.parametrize("path", EDIT, ids=lambda p: p.stem)
def test_an_edit_recipe_is_its_twin_with_the_edit_parts(path: Path) -> None:
    edit, twin = load_recipe(path), load_recipe(ROOT / "recipes" / path.name)
    assert edit.parts["backbone"].type == "world_edit_tiny" and edit.parts["prompts"].type == "world_edit"
    assert [r.type for r in edit.rewards] == ["world_edit_verifier"]
    for kind in METHOD:
        assert edit.parts[kind].to_table() == twin.parts[kind].to_table(), kind
    assert edit.schedule == twin.schedule and edit.optim == twin.optim and edit.seed == twin.seed
    for key in ("max_steps", "prompts_per_step", "train_batch_size", "torch_threads"):
        assert getattr(edit.trainer, key) == getattr(twin.trainer, key), key
    held_out = edit.parts["prompts"].config.eval_count
    if path.stem == "egrpo":  # the quickstart measures its gain on 1,000 edits, each evaluation about a minute
        assert edit.trainer.eval_prompts == held_out == 1000 and edit.trainer.eval_every == 120
    else:  # the first 250 held-out edits, kinds in turn
        assert edit.trainer.eval_prompts == 250 <= held_out and edit.trainer.eval_every == twin.trainer.eval_every
    assert reward_condition_problems(edit) == []


@pytest.mark.parametrize("name", ["aegpo", "diffusion_nft"])
def test_an_edit_recipe_trains_an_iteration(name: str, tmp_path: Path) -> None:
    """AEGPO's attention-entropy probe and allocation, and DiffusionNFT's forward-process loss, on the edit base."""
    run = train(load_recipe(ROOT / "recipes" / "edit" / f"{name}.toml", ONE_ITERATION), tmp_path / name, quiet=True)
    last = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][-1]
    assert last["step"] == 1 and np.isfinite(last["loss"]) and 0.0 <= last["eval/strict"] <= 1.0
    assert 0.0 <= last["reward/world_edit_verifier"] <= 1.0
