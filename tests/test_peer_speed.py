"""scripts/peer_speed.py: the settings it gives flowrl's side, the official configuration it writes, its one-line
errors, and the yardstick (scripts/peer_probe.py) counting what flowrl's own counters say. The official trainer
itself is not run here: it needs a clone of its repository, which tests never fetch."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import peer_speed  # noqa: E402


def test_a_folder_that_is_not_a_clone_is_refused_in_one_line(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "scripts/peer_speed.py", "--flow-grpo", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [f"peer_speed: --flow-grpo {tmp_path}: not a clone of "
                                               "yifan123/flow_grpo (no scripts/train_sd3.py)"]


def test_both_sides_get_the_same_work(tmp_path: Path) -> None:
    """flowrl's recipe and the official configuration carry the setting's numbers and the official LoRA layers."""
    from flowrl.config.recipe import load_recipe

    setting = peer_speed.SETTINGS["lora32_20steps"]
    paths = peer_speed.prepare("lora32_20steps", setting, tmp_path, tmp_path / "clone")
    recipe = load_recipe(paths["recipe"])
    assert recipe.parts["backbone"].config.resolution == setting["resolution"]
    assert recipe.parts["backbone"].config.max_sequence_length == 128  # the official encoder's T5 length
    assert recipe.schedule.num_steps == setting["steps"] and recipe.trainer.prompts_per_step == setting["prompts"]
    assert recipe.parts["sampler"].config.group_size == setting["group"]
    assert recipe.lora is not None and tuple(recipe.lora.target_modules or ()) == peer_speed.OFFICIAL_LORA
    assert (recipe.lora.rank, recipe.lora.alpha) == (32, 64.0)
    config = paths["config"].read_text()
    ast.parse(config)
    batch = setting["prompts"] * setting["group"]
    for line in (f"sample.num_steps = {setting['steps']}", f"sample.train_batch_size = {batch}",
                 f"train.batch_size = {batch}", f"sample.num_image_per_prompt = {setting['group']}",
                 f"config.resolution = {setting['resolution']}", "config.use_lora = True"):
        assert line in config, line
    words = json.loads((tmp_path / "model" / "tokenizer" / "tokenizer.json").read_text())["model"]["vocab"]
    for prompt in (tmp_path / "prompts" / "train.txt").read_text().splitlines():
        assert all(w in words for w in prompt.split()), prompt  # prompts decode back to themselves officially


@pytest.mark.parametrize("side", ["flowrl", "flowrl_recompute", "flowrl_checkpointed", "flowrl_budget"])
def test_the_probe_counts_what_flowrl_counts(side: str, tmp_path: Path) -> None:
    """flowrl's side through the probe: transformer rows with gradient are the trained steps' conditional rows;
    with and without gradient they add up to flowrl's own NFE (retain, with or without gradient checkpointing,
    whose block recomputation is inside the backward), or the update's frozen unconditional rows come on top
    (recompute); every phase's seconds are finite and within the iteration's. The memory-matched side runs
    under trainer.memory_budget."""
    setting = {**peer_speed.SETTINGS["lora32"], "steps": 4}
    paths = peer_speed.prepare("lora32", setting, tmp_path, tmp_path / "clone")
    # the memory-matched side under a budget it fits: its warm-up keeps one call whole and checkpoints the rest
    figures = peer_speed.run_side(side, paths, tmp_path / "clone", 1, tmp_path / side, budget_mb=100_000)
    [iteration] = figures["iterations"]
    lines = (tmp_path / side / "run" / "metrics.jsonl").read_text().splitlines()
    nfe = json.loads(lines[-1])["nfe"] - json.loads(lines[-2])["nfe"]  # the timed iteration's (nfe is cumulative)
    rows, images = iteration["rows"], setting["prompts"] * setting["group"]
    assert rows["grad"] == int(0.99 * setting["steps"]) * images
    if side != "flowrl_recompute":
        assert figures["update"] == "retain" and rows["grad"] + rows["no_grad"] == nfe
    else:
        assert figures["update"] == "recompute" and rows["no_grad"] == nfe + rows["grad"]
    assert nfe == 2 * setting["steps"] * images  # CFG: two rows a latent
    assert 0 < sum(iteration["phases"].values()) <= iteration["seconds"] and figures["peak_mb"] > 0
    recipe = json.loads((tmp_path / side / "job.json").read_text())
    assert any(o.startswith("trainer.memory_budget=") for o in recipe["overrides"]) == (side == "flowrl_budget")
