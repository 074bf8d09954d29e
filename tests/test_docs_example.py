"""The custom selector in docs/writing-a-component.md works as printed: it loads, plans and trains."""

from __future__ import annotations

import json
import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from conftest import ROOT, tiny_recipe

import flowrl
from flowrl.config.recipe import RecipeError, recipe_from_dict
from flowrl.core.registry import registry
from flowrl.trainer import train

PAGE = ROOT / "docs" / "writing-a-component.md"
MARKER = "# docs-example: custom-selector"
MODULE = "docs_example_selector"
NAME = "my_random_window"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.M | re.S)


def example_code() -> str:
    blocks = [b for b in BLOCK.findall(PAGE.read_text(encoding="utf-8")) if b.lstrip().startswith(MARKER)]
    assert blocks, f"no python block starting with '{MARKER}' in {PAGE}"
    return "\n".join(blocks)


@pytest.fixture
def example() -> Iterator[types.ModuleType]:
    """The page's example executed as module ``docs_example_selector``; unregistered afterwards."""
    module = types.ModuleType(MODULE)
    module.__file__ = str(PAGE)
    sys.modules[MODULE] = module
    try:
        exec(compile(example_code(), str(PAGE), "exec"), module.__dict__)
        yield module
    finally:
        sys.modules.pop(MODULE, None)
        registry("selector")._classes.pop(NAME, None)  # keep the global registry as other tests expect it


def selector_recipe(selector: dict, **trainer: object) -> dict:
    data = tiny_recipe(**trainer)
    data["selector"] = selector
    return data


def test_example_plans_a_window(example: types.ModuleType) -> None:
    assert NAME in flowrl.available("selector")
    kernel = flowrl.build("kernel", {"type": "flow_grpo_sde"})
    schedule = flowrl.Schedule(sigmas=(1.0, 0.9, 0.7, 0.5, 0.3, 0.0), kernel=kernel)
    selector = flowrl.build("selector", {"type": NAME, "width": 2, "max_start": 4})
    generator = torch.Generator().manual_seed(0)
    for iteration in range(20):
        plan = selector.plan(schedule, iteration, generator)
        starts = [u.start for u in plan.units]
        assert len(starts) == 2 and starts[1] == starts[0] + 1 and 0 <= starts[0] <= 3
        assert plan.trained == (0, 1)


def test_example_checks_steps_at_load(example: types.ModuleType) -> None:
    with pytest.raises(RecipeError, match=r"\[selector.width\] a window of 5 steps does not fit in 4 steps"):
        recipe_from_dict(selector_recipe({"type": NAME, "width": 5}))


def test_example_trains_one_iteration(example: types.ModuleType, tmp_path: Path) -> None:
    params = {"width": 2, "max_start": 2}
    by_name = recipe_from_dict(selector_recipe({"type": NAME, **params}, max_steps=1))
    dotted = recipe_from_dict(selector_recipe({"type": f"{MODULE}:RandomWindow", **params}, max_steps=1))
    assert by_name.parts["selector"].cls is dotted.parts["selector"].cls is example.RandomWindow
    run = train(dotted, tmp_path / "run", quiet=True)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1]
    assert rows[0]["nfe"] == 2 * 4 * 4  # 2 prompts x G = 4 x 4 steps
    assert rows[0]["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert f'type = "{MODULE}:RandomWindow"' in (run / "recipe.toml").read_text()
