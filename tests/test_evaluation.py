"""Evaluation you can trust: the world's balanced test prompts, per-category figures with standard errors,
pass@G from stochastic samples, and the timestep profile, through the real CLI and the shipped base model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from test_cli import flowrl_cli

import flowrl
from flowrl.core.types import Schedule
from flowrl.evaluation.profile import front_to_back, one_step_images
from flowrl.world import KINDS, balanced_scenes, render_batch, scene_split
from flowrl.world.components import WorldPrompts, WorldVerifier
from flowrl.world.render import Lattice

EVAL_KEYS = {"score", "strict", "score_se", "strict_se", "pass_at_1", "pass_at_2", "prompts", "nfe"}


def test_world_evaluation_prompts_are_the_balanced_test_split() -> None:
    prompts = WorldPrompts(WorldPrompts.Config()).heldout()
    assert len(prompts) == 256
    scenes = balanced_scenes("test", 256, 1234)
    assert prompts == [s.text for s in scenes]
    assert all(scene_split(s) == "test" for s in scenes)
    assert [sum(s.kind == k for s in scenes) for k in KINDS] == [64] * 4
    novel = WorldPrompts(WorldPrompts.Config(eval_split="novel", eval_count=8)).heldout()
    assert len(novel) == 8 and not set(novel) & set(prompts)


def test_eval_metrics_per_category_with_standard_errors() -> None:
    scenes = balanced_scenes("test", 40, 3)
    images = render_batch(scenes, seed=4, lattice=Lattice(8, (1, 1)), flat=(60.0,))
    pixels = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255.0
    prompts = [s.text for s in scenes]
    figures = WorldVerifier(WorldVerifier.Config()).eval_metrics(pixels, prompts)
    assert figures["strict"] == 1.0 and figures["strict_se"] == 0.0
    assert all(figures[f"strict/{k}"] == 1.0 for k in KINDS)
    assert figures["objects"] == figures["objects_asked"] == np.mean([s.num_objects for s in scenes])
    half = pixels.clone()
    half[::2] = 0.5  # blank grey: nothing drawn, score 0
    figures = WorldVerifier(WorldVerifier.Config()).eval_metrics(half, prompts)
    assert figures["strict"] == 0.5
    # the standard error of a mean of 20 ones and 20 zeros: sqrt(0.25 * 40 / 39 / 40)
    assert abs(figures["strict_se"] - np.sqrt(0.25 / 39)) < 1e-12


def test_eval_json_has_every_figure_and_pass_at_g_bounds_pass_at_1() -> None:
    out = flowrl_cli("eval", "recipes/flow_grpo.toml", "--json", "--prompts", "8", "--group-size", "2")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert set(result) >= EVAL_KEYS and {f"strict/{k}" for k in KINDS} <= set(result)
    assert result["prompts"] == 8
    assert 0.0 <= result["pass_at_1"] <= result["pass_at_2"] <= 1.0
    assert result["nfe"] == 8 * 16 + 8 * 2 * 16  # ODE samples, then G SDE samples per prompt
    novel = json.loads(
        flowrl_cli("eval", "recipes/flow_grpo.toml", "--json", "--prompts", "4", "--split", "novel").stdout
    )
    assert novel["prompts"] == 4 and "pass_at_1" not in novel


def test_split_on_a_prompt_list_is_a_one_line_error(tmp_path: Path) -> None:
    recipe = tmp_path / "r.toml"
    text = (Path(__file__).parents[1] / "recipes" / "flow_grpo.toml").read_text()
    recipe.write_text(text.replace('[prompts]\ntype = "world"', '[prompts]\ntype = "list"\nprompts = ["a red circle"]'))
    out = flowrl_cli("eval", str(recipe), "--split", "test")
    assert out.returncode == 2 and "--split applies to the embedded world" in out.stderr
    assert "Traceback" not in out.stderr
    out = flowrl_cli("eval", str(recipe), "--prompts", "-1")
    assert out.returncode == 2 and "--prompts" in out.stderr


def test_one_step_sampling_shares_the_initial_noise() -> None:
    """With the ODE kernel the perturbed step adds no noise, so a prompt's group is one image repeated."""
    backbone = flowrl.build("backbone", {"type": "world_tiny"})
    sigmas = backbone.schedule_sigmas(6, 3.0)
    prompts = ["a red circle", "two blue squares"]
    still = one_step_images(backbone, prompts, Schedule(sigmas, flowrl.build("kernel", {"type": "ode"})), 1, 3, 0)
    assert still.shape[0] == 6
    spread = still.reshape(2, 3, -1).std(dim=1)
    assert float(spread.max()) < 1e-5  # same inputs; rows of one batch may differ only in the last bits
    sde = Schedule(sigmas, flowrl.build("kernel", {"type": "flow_grpo_sde", "noise_level": 0.7}))
    moved = one_step_images(backbone, prompts, sde, 1, 3, 0).reshape(2, 3, -1).std(dim=1)
    assert float(moved.mean(dim=1).min()) > 1e-3  # every prompt's group differs


def test_profile_cli_prints_one_row_per_step_and_plots(tmp_path: Path) -> None:
    plot = tmp_path / "profile.png"
    args = ("--prompts", "2", "--group-size", "2", "--json", "--plot", str(plot), "--set", "schedule.num_steps=4")
    out = flowrl_cli("profile", "recipes/flow_grpo.toml", *args)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    rows = result["steps"]
    assert [r["step"] for r in rows] == [0, 1, 2, 3] and result["group_size"] == 2
    assert all(a["sigma"] > b["sigma"] for a, b in zip(rows, rows[1:], strict=False))
    assert all(r["std"] > 0 and r["spread"] >= 0 and 0 <= r["nonzero"] <= 1 for r in rows)
    assert result["front_to_back"] == front_to_back(rows)
    assert plot.stat().st_size > 1000
