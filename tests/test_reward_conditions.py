"""A reward declares whether it reads the prompts' condition images: one that needs them is refused on prompts
without any (flowrl validate and flowrl train, one line naming it); a text-only reward scores an edit's result
alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, tiny_recipe
from PIL import Image

import flowrl
from flowrl.config.condition_checks import reward_condition_problems
from flowrl.config.recipe import RecipeError, recipe_from_dict
from flowrl.core.registry import registry
from flowrl.trainer import train

EDIT_REWARD = [{"type": "world_edit_verifier"}]
# the rewards that read the source
SOURCE_READERS = ("world_edit_verifier", "edit_judge", "edit_preservation", "edit_feature_similarity")


def _recipe(prompts: dict, reward: list[dict] = EDIT_REWARD, **extra: object) -> dict:
    data = tiny_recipe()
    data.update(prompts=prompts, reward=reward, **extra)
    return data


def _problems(data: dict) -> list[tuple[str, str]]:
    return reward_condition_problems(recipe_from_dict(data))


def test_the_shipped_parts_declare_what_they_read_and_give() -> None:
    for name, cls in registry("reward").items():
        assert cls.needs_conditions(cls.Config()) is (name in SOURCE_READERS), name
    remote = registry("reward").get("remote")
    assert remote.needs_conditions(remote.Config(conditions=True)) is True  # it sends them: the server reads them
    given = {name: cls.gives_conditions(None) for name, cls in registry("prompts").items()}
    assert given == {"list": "none", "text_file": "none", "jsonl": None, "world": "none", "world_edit": "all"}


def test_an_edit_reward_on_a_text_task_is_refused_naming_it() -> None:
    problems = _problems(_recipe({"type": "world", "eval_count": 5}))
    assert len(problems) == 1
    key, message = problems[0]
    assert key == "reward"
    assert message.startswith("'world_edit_verifier' needs each prompt's condition images")
    assert "[prompts] type = 'world' gives prompts without any (a text-to-image task)" in message
    named = [{"type": "world_edit_verifier", "name": "edit"}, {"type": "jpeg_compressibility"}]
    ((key, message),) = _problems(_recipe({"type": "list", "prompts": ["a red circle"]}, named))
    assert key == "reward[0]" and message.startswith("'edit' (world_edit_verifier) needs")


def test_an_edit_reward_on_an_edit_task_and_a_text_reward_anywhere_pass() -> None:
    assert _problems(_recipe({"type": "world_edit", "eval_count": 5})) == []
    text_only = [{"type": "jpeg_compressibility"}]
    assert _problems(_recipe({"type": "world_edit", "eval_count": 5}, text_only)) == []
    assert _problems(_recipe({"type": "world", "eval_count": 5}, text_only)) == []


def test_a_text_reward_scores_an_edit_result_alone() -> None:
    source = flowrl.build("prompts", {"type": "world_edit", "eval_count": 5})
    prompts = source.heldout()
    images = torch.rand(len(prompts), 3, 32, 32, generator=torch.Generator().manual_seed(0))
    reward = flowrl.build("reward", {"type": "jpeg_compressibility"})
    assert torch.equal(reward.score(images, prompts), reward.score(images, [str(p) for p in prompts]))


def _jsonl(folder: Path, records: list[dict]) -> Path:
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(folder / "src.png")
    path = folder / "edits.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_a_prompt_file_is_looked_at_record_by_record(tmp_path: Path) -> None:
    with_image = {"prompt": "make the red circle green", "image": "src.png"}
    path = _jsonl(tmp_path, [with_image, with_image])
    assert _problems(_recipe({"type": "jsonl", "path": str(path)})) == []
    path = _jsonl(tmp_path, [{"prompt": "a red circle"}])
    ((_, message),) = _problems(_recipe({"type": "jsonl", "path": str(path)}))
    assert "[prompts] type = 'jsonl' gives prompts without any (a text-to-image task)" in message
    path = _jsonl(tmp_path, [with_image, {"prompt": "a red circle"}])
    ((_, message),) = _problems(_recipe({"type": "jsonl", "path": str(path)}))
    assert f"gives prompts without any ([prompts.path] prompt file {path}, record 2 (line 2) has none)" in message
    ((key, message),) = _problems(_recipe({"type": "jsonl", "path": str(tmp_path / "missing.jsonl")}))
    assert key == "prompts" and "no such file" in message  # the file's own problem, not a traceback


def test_validate_refuses_it_in_one_line(tmp_path: Path) -> None:
    text = (ROOT / "recipes" / "egrpo.toml").read_text()
    assert '[prompts]\ntype = "world"' in text
    recipe = tmp_path / "edit_reward.toml"
    recipe.write_text(text.replace('type = "world_verifier"', 'type = "world_edit_verifier"'))
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "flowrl.cli.main", "validate", str(recipe)],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=300,
    )
    assert out.returncode == 2 and "Traceback" not in out.stdout + out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0] == f"recipe error: 1 problem in {recipe}"
    assert len(lines) == 2 and lines[1].startswith("  [reward] 'world_edit_verifier' needs each prompt's condition")


def test_train_refuses_it_before_the_model_loads(tmp_path: Path) -> None:
    data = _recipe({"type": "world", "eval_count": 5})
    data["backbone"] = {"type": "world_tiny", "path": str(tmp_path / "no_model_here")}
    with pytest.raises(RecipeError, match=r"'world_edit_verifier' needs each prompt's condition images"):
        train(recipe_from_dict(data), tmp_path / "run", quiet=True)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
