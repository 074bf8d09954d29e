"""Every selector, sampler and kernel of every shipped recipe (embedded and paper-scale, core and zoo) keeps
its interface's rules (flowrl.conformance), run on the tiny FLUX model; and the checks can fail. Estimators and
losses: tests/test_conformance_parts.py; rewards and backbones: tests/test_conformance_models.py."""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
from conftest import ROOT

import flowrl
from flowrl.config.recipe import Recipe, load_recipe
from flowrl.conformance import ConformanceError, check_kernel, check_sampler, check_selector
from flowrl.core.registry import registry
from flowrl.core.types import Plan, Schedule, Unit

RECIPES = sorted(p for p in (ROOT / "recipes").rglob("*.toml") if "pretrain" not in p.parts)
PROMPTS = ["a red circle", "two blue squares"]


@functools.cache
def tiny() -> Any:
    settings = {"type": "tiny_flux", "resolution": 16, "num_layers": 1, "num_single_layers": 1}
    backbone = flowrl.build("backbone", settings)
    backbone.set_reference(contextlib.nullcontext)  # untrained: the policy is its own reference (AEGPO probes)
    return backbone


def recipe_id(path: Path) -> str:
    return str(path.relative_to(ROOT / "recipes"))


@functools.cache
def loaded(path: Path) -> tuple[Recipe, Schedule]:
    recipe = load_recipe(path)
    grid = recipe.schedule
    schedule = Schedule(tiny().schedule_sigmas(grid.num_steps, grid.shift), recipe.build("kernel"))
    return recipe, schedule


def observer(recipe: Recipe) -> Any:
    """Selectors that override ``observe`` probe the model before planning."""
    cls = recipe.parts["selector"].cls
    if cls.observe is flowrl.TimestepSelector.observe:
        return None
    schedule = loaded(Path(recipe.source))[1] if Path(recipe.source).exists() else None
    return lambda selector: selector.observe(tiny(), PROMPTS, schedule)


# Registered parts no shipped recipe uses, checked with these settings.
EXTRA_SELECTORS = {"explicit": {"units": [[0, 1], [2, 2]]}}
EXTRA_KERNELS = {"cps": {"noise_level": 0.7}, "ode": {}}


def test_every_registered_part_is_checked() -> None:
    from test_conformance_models import BACKBONES, REWARDS
    from test_conformance_parts import EXTRA_LOSSES

    for kind, extra in (
        ("selector", EXTRA_SELECTORS),
        ("sampler", {}),
        ("kernel", EXTRA_KERNELS),
        ("advantage", {}),
        ("loss", EXTRA_LOSSES),
    ):
        used = {load_recipe(p).parts[kind].type for p in RECIPES} | set(extra)
        assert set(registry(kind).names()) <= used, f"{kind}: {set(registry(kind).names()) - used} unchecked"
    # rewards and backbones: every registered one, on local tiny weights (tests/test_conformance_models.py)
    assert set(registry("reward").names()) <= set(REWARDS), set(registry("reward").names()) - set(REWARDS)
    assert set(registry("backbone").names()) <= set(BACKBONES), set(registry("backbone").names()) - set(BACKBONES)


@pytest.mark.parametrize("kind", ["selector", "kernel"])
def test_parts_no_recipe_uses_conform(kind: str) -> None:
    schedule = loaded(ROOT / "recipes" / "flow_grpo.toml")[1]
    for name, settings in (EXTRA_SELECTORS if kind == "selector" else EXTRA_KERNELS).items():
        make = functools.partial(flowrl.build, kind, {"type": name, **settings})
        if kind == "selector":
            check_selector(make, schedule)
        else:
            check_kernel(make(), Schedule(schedule.sigmas, make()))


@pytest.mark.parametrize("path", RECIPES, ids=recipe_id)
def test_selector_and_kernel_conform(path: Path) -> None:
    recipe, schedule = loaded(path)
    check_kernel(schedule.kernel, schedule)
    check_selector(lambda: recipe.build("selector"), schedule, observe=observer(recipe))


def first_plan(recipe: Recipe, schedule: Schedule) -> Plan:
    """The recipe's own selector's plan for iteration 0 (after observing the model, if it does)."""
    selector = recipe.build("selector")
    if (watch := observer(recipe)) is not None:
        watch(selector)
    return selector.plan(schedule, 0, torch.Generator().manual_seed(0))


@pytest.mark.parametrize("path", RECIPES, ids=recipe_id)
def test_sampler_conforms(path: Path) -> None:
    recipe, schedule = loaded(path)
    plan = first_plan(recipe, schedule)
    rollout = check_sampler(lambda: recipe.build("sampler"), tiny(), schedule, plan, PROMPTS)
    assert rollout.num_rollouts >= len(PROMPTS)


# -- the checks can fail ------------------------------------------------------------------------
class ForgetfulSelector(flowrl.TimestepSelector):
    """Moves its unit every iteration but keeps the position out of state_dict."""

    @attrs.frozen
    class Config:
        pass

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.position = 0

    def plan(self, schedule: Schedule, iteration: int, generator: torch.Generator) -> Plan:
        self.position = (self.position + 1) % schedule.num_steps
        return Plan(units=(Unit(self.position),), trained=(0,))


class RandomSelector(ForgetfulSelector):
    """Ignores the generator it is given: not reproducible."""

    def plan(self, schedule: Schedule, iteration: int, generator: torch.Generator) -> Plan:
        return Plan(units=(Unit(int(torch.randint(schedule.num_steps, ())),),), trained=(0,))


class StraySelector(ForgetfulSelector):
    def plan(self, schedule: Schedule, iteration: int, generator: torch.Generator) -> Plan:
        return Plan(units=(Unit(schedule.num_steps),), trained=(0,))


class NoisyStd(flowrl.TransitionKernel):
    """Its std depends on the latent: not a kernel the trainer can use."""

    @attrs.frozen
    class Config:
        pass

    def mean_std(self, x: Any, v: Any, s: Any, s_next: Any, s_at_one: float) -> Any:
        return x + (s_next - s).reshape(-1, *[1] * (x.dim() - 1)) * v, x.flatten(1).abs().mean(1)


@pytest.mark.parametrize(
    ("selector", "rule"),
    [(ForgetfulSelector, "state_dict"), (RandomSelector, "same generator"), (StraySelector, "outside the schedule")],
)
def test_broken_selectors_are_caught(selector: type, rule: str) -> None:
    schedule = loaded(RECIPES[0])[1]
    with pytest.raises(ConformanceError, match=rule):
        check_selector(lambda: selector(selector.Config()), schedule)


def test_a_kernel_whose_std_depends_on_the_latent_is_caught() -> None:
    schedule = loaded(RECIPES[0])[1]
    with pytest.raises(ConformanceError, match="must not depend on the latent"):
        check_kernel(NoisyStd(NoisyStd.Config()), schedule)


def test_a_sampler_that_misdeclares_its_rollout_count_is_caught() -> None:
    """A sampler that shapes its groups (here: a group per trained unit) but keeps the default count."""
    recipe, schedule = loaded(ROOT / "recipes" / "tempflow_grpo.toml")
    base = registry("sampler").get("anchor_branch")

    class Undeclared(base):  # type: ignore[misc, valid-type]
        def rollout_count(self, plan: Plan, num_prompts: int) -> int:
            return int(flowrl.RolloutSampler.rollout_count(self, plan, num_prompts))

    config = base.Config(group_size=3)
    plan = Plan(units=(Unit(0), Unit(2)), trained=(0, 1))
    with pytest.raises(ConformanceError, match="rollout_count"):
        check_sampler(lambda: Undeclared(config), tiny(), schedule, plan, PROMPTS)


def test_a_sampler_that_miscounts_its_nfe_is_caught() -> None:
    recipe, schedule = loaded(ROOT / "recipes" / "flow_grpo.toml")
    base = registry("sampler").get("independent")

    class Miscounting(base):  # type: ignore[misc, valid-type]
        def rollout(self, *args: Any) -> Any:
            out = super().rollout(*args)
            out.nfe -= 1
            return out

    config = recipe.parts["sampler"].config
    plan = Plan(units=(Unit(0),), trained=(0,))
    with pytest.raises(ConformanceError, match="rollout.nfe"):
        check_sampler(lambda: Miscounting(config), tiny(), schedule, plan, PROMPTS)
