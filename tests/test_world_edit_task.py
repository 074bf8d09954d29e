"""The world's edit task as parts (flowrl.world.edit_components): its prompt source, its verifier reward, and one
training iteration through the shared loop with the edit base, every method part unchanged."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_recipe

import flowrl
from flowrl.config.recipe import recipe_from_dict
from flowrl.core.conditions import Condition, Prompt, conditions_of
from flowrl.trainer import train
from flowrl.world import verify_batch
from flowrl.world.components import BASE_MODEL
from flowrl.world.edit import EDIT_KINDS, edit_split, enumerate_edits, parse_instruction
from flowrl.world.edit_render import render_edit_batch


def test_the_prompt_source_gives_instructions_with_their_rendered_sources() -> None:
    source = flowrl.build("prompts", {"type": "world_edit", "eval_count": 10, "layouts": 2})
    drawn = source.sample(20, torch.Generator().manual_seed(0))
    assert drawn == source.sample(20, torch.Generator().manual_seed(0))  # the same draws, the same images
    train = {e.text: e for e in enumerate_edits("train")}
    for prompt in drawn:
        (condition,) = conditions_of(prompt)
        assert edit_split(train[str(prompt)]) == "train" and condition.pixels.shape == (32, 32, 3)
    heldout = source.heldout()
    assert [parse_instruction(str(p)).kind for p in heldout] == list(EDIT_KINDS) * 2
    assert heldout == flowrl.build("prompts", {"type": "world_edit", "eval_count": 10, "layouts": 2}).heldout()


def test_training_draws_take_the_kinds_equally_often() -> None:
    """The train split holds 43% recolours and 1% count changes; RL draws the kind first, as evaluation weighs
    them (1,000 draws: each kind's share within 0.2 +- 0.04, about 3 standard errors), every edit of a kind
    alike."""
    source = flowrl.build("prompts", {"type": "world_edit", "eval_count": 5, "layouts": 2})
    drawn = source.sample(1000, torch.Generator().manual_seed(1))
    shares = {k: n / 1000 for k, n in collections.Counter(parse_instruction(str(p)).kind for p in drawn).items()}
    assert set(shares) == set(EDIT_KINDS) and all(abs(v - 0.2) < 0.04 for v in shares.values()), shares
    count = {str(p) for p in drawn if parse_instruction(str(p)).kind == "count"}
    assert len(count) >= 25  # not a few count edits repeated: 28 texts among the 36 train count edits


def test_the_reward_scores_targets_one_and_sources_zero() -> None:
    source = flowrl.build("prompts", {"type": "world_edit", "eval_count": 10})
    edits = enumerate_edits("train")[::700][:10]
    sources, targets = render_edit_batch(edits, seed=1)
    assert all(v.strict for v in verify_batch(sources, [e.source for e in edits]))
    prompts = [Prompt(e.text, [Condition(img)]) for e, img in zip(edits, sources, strict=True)]
    as_tensor = lambda a: torch.from_numpy(a).permute(0, 3, 1, 2).float() / 255  # noqa: E731
    reward = flowrl.build("reward", {"type": "world_edit_verifier"})
    assert torch.equal(reward.score(as_tensor(targets), prompts), torch.ones(len(edits)))
    assert torch.equal(reward.score(as_tensor(sources), prompts), torch.zeros(len(edits)))
    figures = reward.eval_metrics(as_tensor(targets), prompts)
    assert figures["strict"] == figures["score"] == figures["follow"] == figures["preserve"] == 1.0
    assert {k for k in figures if k.startswith("strict/")} <= {f"strict/{k}" for k in EDIT_KINDS}
    strict = flowrl.build("reward", {"type": "world_edit_verifier", "strict": True})
    assert torch.equal(strict.score(as_tensor(targets), prompts), torch.ones(len(edits)))
    with pytest.raises(ValueError, match="has 0 condition images"):
        reward.score(as_tensor(targets[:1]), ["make the red circle green"])
    assert len(source.heldout()) == 10


def test_one_iteration_of_an_edit_task_through_the_shared_loop(tmp_path: Path) -> None:
    """The recipe's selector, sampler, kernel, advantage and loss are the text-to-image ones, unchanged."""
    data = tiny_recipe(max_steps=1, eval_every=1, eval_prompts=5)
    data.update(
        backbone={"type": "world_edit_tiny", "path": str(BASE_MODEL)},
        prompts={"type": "world_edit", "eval_count": 5},
        reward=[{"type": "world_edit_verifier"}],
    )
    run = train(recipe_from_dict(data), tmp_path / "run", quiet=True)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    last = rows[-1]
    assert last["step"] == 1 and np.isfinite(last["loss"]) and 0.0 <= last["reward/world_edit_verifier"] <= 1.0
    assert "eval/strict/recolour" in last and 0.0 <= last["eval/strict"] <= 1.0
