"""The registries: lookup by name, plugin entry point and dotted path; errors that help."""

from __future__ import annotations

import attrs
import pytest
import torch

import flowrl
from flowrl.core.registry import Registry, RegistryError, registry
from flowrl.core.types import Plan, Schedule, Unit


class MySelector(flowrl.TimestepSelector):
    """A research selector outside any package: SDE at step 0 only."""

    @attrs.frozen
    class Config:
        step: int = 0

    def plan(self, schedule: Schedule, iteration: int, generator: torch.Generator) -> Plan:
        return Plan(units=(Unit(self.config.step),), trained=(0,))


def test_every_kind_has_components() -> None:
    for kind in flowrl.KINDS:
        assert flowrl.available(kind), kind


def test_zoo_is_discovered_through_entry_points() -> None:
    # The core never imports flowrl_zoo; these names come from the flowrl.plugins entry point.
    assert {"flow_grpo_prefix", "dance_random_subset"} <= set(flowrl.available("selector"))


def test_build_by_name_validates_config() -> None:
    kernel = flowrl.build("kernel", {"type": "flow_grpo_sde", "noise_level": 0.5})
    assert kernel.config.noise_level == 0.5
    with pytest.raises(ValueError, match="noise_level"):
        flowrl.build("kernel", {"type": "flow_grpo_sde", "noise_level": -1.0})


def test_dotted_path_lookup() -> None:
    selector = flowrl.build("selector", {"type": f"{__name__}:MySelector", "step": 2})
    assert isinstance(selector, MySelector)
    assert selector.config.step == 2


def test_did_you_mean() -> None:
    with pytest.raises(RegistryError, match="did you mean 'flow_grpo_sde'"):
        flowrl.build("kernel", {"type": "flow_grpo_sd"})


def test_duplicate_name_raises() -> None:
    reg = Registry("selector", flowrl.TimestepSelector)
    reg.register("mine")(MySelector)
    with pytest.raises(RegistryError, match="already registered"):
        reg.register("mine")(MySelector)


def test_interface_is_checked() -> None:
    reg = Registry("selector", flowrl.TimestepSelector)

    class NotASelector:
        @attrs.frozen
        class Config:
            pass

    with pytest.raises(RegistryError, match="is not a TimestepSelector"):
        reg.register("bad")(NotASelector)

    class NoConfig(flowrl.TimestepSelector):
        def plan(self, schedule: Schedule, iteration: int, generator: torch.Generator) -> Plan:
            raise NotImplementedError

    with pytest.raises(RegistryError, match="Config"):
        reg.register("noconfig")(NoConfig)

    class Incomplete(flowrl.TimestepSelector):
        @attrs.frozen
        class Config:
            pass

    with pytest.raises(RegistryError, match="does not implement plan"):
        reg.register("incomplete")(Incomplete)


def test_unknown_kind() -> None:
    with pytest.raises(RegistryError, match="unknown kind"):
        flowrl.available("selectors")


def test_class_hooks_must_be_static_and_dots_get_a_colon_hint() -> None:
    reg = Registry("selector", flowrl.TimestepSelector)

    class OrdinaryHook(flowrl.TimestepSelector):
        @attrs.frozen
        class Config:
            pass

        def plan(self, schedule: Schedule, iteration: int, generator: torch.Generator) -> Plan:
            raise NotImplementedError

        def check_steps(self, config: object, num_steps: int) -> list[tuple[str, str]]:
            return []

    with pytest.raises(RegistryError, match=r"OrdinaryHook.check_steps must be a @staticmethod"):
        reg.register("ordinary")(OrdinaryHook)
    with pytest.raises(RegistryError, match=r"did you mean 'mysel:LastK'\?"):
        registry("selector").get("mysel.LastK")
