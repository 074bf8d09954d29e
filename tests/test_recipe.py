"""Recipes: every shipped recipe validates; mistakes are reported all at once with key paths."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from conftest import ROOT, tiny_recipe

from flowrl import RecipeError, load_recipe
from flowrl.config.recipe import recipe_from_dict

# Training recipes (recipes/pretrain/ holds pre-training recipes, a different schema).
RECIPES = sorted(p for p in (ROOT / "recipes").rglob("*.toml") if "pretrain" not in p.parts)


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: str(p.relative_to(ROOT)))
def test_shipped_recipes_validate(path: Path) -> None:
    recipe = load_recipe(path)
    assert recipe.name


def test_resolved_recipe_round_trips(tmp_path: Path) -> None:
    recipe = recipe_from_dict(tiny_recipe())
    path = tmp_path / "resolved.toml"
    path.write_text(recipe.to_toml())
    again = load_recipe(path)
    assert again.to_dict() == recipe.to_dict()
    assert tomllib.loads(recipe.to_toml())["sampler"]["group_size"] == 4


def test_all_problems_collected_with_paths() -> None:
    data = tiny_recipe()
    data["selector"]["type"] = "explicit_unit"
    data["sampler"]["group_sise"] = 8
    data["optim"]["lr"] = -1.0
    data["trainer"]["max_steps"] = "ten"
    with pytest.raises(RecipeError) as info:
        recipe_from_dict(data, source="r.toml")
    report = info.value.report()
    assert report.startswith("recipe error: 4 problems in r.toml")
    assert "[selector] unknown selector type 'explicit_unit'; did you mean 'explicit'?" in report
    assert "[sampler.group_sise] unknown key; did you mean 'group_size'?" in report
    assert "[optim.lr]" in report and "[trainer.max_steps] expected an integer" in report


def test_overrides_are_typed() -> None:
    recipe = recipe_from_dict(tiny_recipe(), ["sampler.group_size=6", "kernel.noise_level=0.5", "name=abc"])
    assert recipe.parts["sampler"].config.group_size == 6
    assert recipe.parts["kernel"].config.noise_level == 0.5
    assert recipe.name == "abc"
    with pytest.raises(RecipeError, match=r"\[sampler.group_size\] expected an integer"):
        recipe_from_dict(tiny_recipe(), ["sampler.group_size=many"])


def test_group_size_one_and_steps_beyond_schedule() -> None:
    data = tiny_recipe()
    data["sampler"]["group_size"] = 1
    data["selector"]["units"] = [[0, 1], [3, 2]]
    with pytest.raises(RecipeError) as info:
        recipe_from_dict(data)
    text = str(info.value)
    assert "[sampler.group_size] group-relative advantages need at least 2" in text
    assert "[selector.units] unit ends at step 5, beyond the schedule's 4 steps" in text


def test_missing_tables_and_unknown_top_level() -> None:
    data = tiny_recipe()
    del data["kernel"]
    data["trainr"] = {}
    with pytest.raises(RecipeError) as info:
        recipe_from_dict(data)
    text = str(info.value)
    assert "[kernel] missing table [kernel]" in text
    assert "[trainr] unknown table or key; did you mean 'trainer'?" in text


def test_syntax_error_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("name = \n")
    with pytest.raises(RecipeError, match=r"\[toml\] syntax error"):
        load_recipe(bad)
    with pytest.raises(RecipeError, match=r"\[file\] no such recipe file"):
        load_recipe(tmp_path / "nope.toml")


def test_multi_reward_names_must_differ() -> None:
    data = tiny_recipe()
    data["reward"] = [{"type": "jpeg_compressibility"}, {"type": "jpeg_compressibility", "weight": 0.5}]
    with pytest.raises(RecipeError, match="two rewards are named 'jpeg_compressibility'"):
        recipe_from_dict(data)
    data["reward"][1]["name"] = "jpeg_b"
    recipe = recipe_from_dict(data)
    assert [r.weight for r in recipe.rewards] == [1.0, 0.5]


def test_attention_kernels_setting() -> None:
    import torch

    from flowrl.trainer.process import allow_attention_kernels

    assert recipe_from_dict(tiny_recipe()).trainer.attention_kernels == "no-cudnn"
    data = tiny_recipe()
    data["trainer"]["attention_kernels"] = "cudnn"
    with pytest.raises(RecipeError, match=r"\[trainer.attention_kernels\]"):
        recipe_from_dict(data)
    cuda = torch.backends.cuda
    before = (
        cuda.cudnn_sdp_enabled(),
        cuda.flash_sdp_enabled(),
        cuda.mem_efficient_sdp_enabled(),
        cuda.math_sdp_enabled(),
    )
    try:
        allow_attention_kernels("math")
        assert (cuda.cudnn_sdp_enabled(), cuda.flash_sdp_enabled(), cuda.math_sdp_enabled()) == (False, False, True)
        allow_attention_kernels("no-cudnn")
        assert not cuda.cudnn_sdp_enabled()
    finally:
        setters = (cuda.enable_cudnn_sdp, cuda.enable_flash_sdp, cuda.enable_mem_efficient_sdp, cuda.enable_math_sdp)
        for enable, value in zip(setters, before, strict=True):
            enable(value)


def test_the_schedule_is_the_recipes_own_table() -> None:
    recipe = recipe_from_dict(tiny_recipe(), ["schedule.num_steps=6"])
    assert (recipe.schedule.num_steps, recipe.schedule.shift) == (6, 3.0)
    assert tomllib.loads(recipe.to_toml())["schedule"] == {"num_steps": 6, "shift": 3.0, "final_sde": False}
    assert "num_steps" not in tomllib.loads(recipe.to_toml())["sampler"]
    with pytest.raises(RecipeError, match=r"\[schedule.num_steps\] must be >= 1"):
        recipe_from_dict(tiny_recipe(), ["schedule.num_steps=0"])


def test_a_recipe_from_before_the_schedule_table_still_loads() -> None:
    """Run folders written before [schedule] kept num_steps and shift in [sampler]: they resume unchanged."""
    old = tiny_recipe()
    del old["schedule"]
    old["sampler"].update(num_steps=5, shift=2.0)
    recipe = recipe_from_dict(old)
    assert (recipe.schedule.num_steps, recipe.schedule.shift) == (5, 2.0)
    assert recipe.to_dict() == recipe_from_dict(recipe.to_dict()).to_dict()
    both = tiny_recipe()
    both["sampler"]["num_steps"] = 5
    with pytest.raises(RecipeError, match=r"\[sampler.num_steps\] set in \[schedule\] too"):
        recipe_from_dict(both)


def test_every_part_checks_its_steps_against_the_schedule() -> None:
    """A sampler's steps are checked like a selector's (AEGPO's delta_steps), through the same declared hook."""
    data = tiny_recipe()
    host = {"type": "independent", "group_size": 4}
    data["sampler"] = {"type": "aegpo_allocate", "host": host, "delta_steps": [1, 4]}
    with pytest.raises(RecipeError, match=r"\[sampler.delta_steps\] steps \[4\] are outside the schedule's steps 0..3"):
        recipe_from_dict(data)
    data["sampler"]["host"]["num_steps"] = 4
    with pytest.raises(RecipeError, match=r"belong in the recipe's \[schedule\] table"):
        recipe_from_dict(data)
