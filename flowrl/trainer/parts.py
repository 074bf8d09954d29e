"""The recipe's parts, built once for a run, cheapest failure first: the rewards and trackers (missing weights or
extras), the prompts and their condition images (checked against the base before it loads), the method's parts,
then the backbone on the process's device and its two sigma grids (training and evaluation)."""

from __future__ import annotations

from typing import Any

import attrs
import torch

from flowrl.config.condition_checks import check_reward_conditions
from flowrl.config.recipe import Recipe
from flowrl.core.conditions import check_source
from flowrl.core.interfaces import (
    AdvantageEstimator,
    Backbone,
    Loss,
    PromptSource,
    RolloutSampler,
    TimestepSelector,
    TransitionKernel,
)
from flowrl.core.types import Schedule
from flowrl.trainer.overlap import overlapped
from flowrl.trainer.rewards import RewardPhase
from flowrl.trainer.trackers import check_trackers


@attrs.define(frozen=True)
class RunParts:
    """Everything a recipe names, built: what the loop composes and what a checkpoint keeps besides the policy."""

    rewards: RewardPhase
    prompts: PromptSource
    selector: TimestepSelector
    sampler: RolloutSampler  # wrapped for trainer.overlap_chunks where it declares itself chunkable
    estimator: AdvantageEstimator
    loss: Loss
    kernel: TransitionKernel
    backbone: Backbone
    schedule: Schedule  # the training grid with the recipe's kernel
    eval_schedule: Schedule  # trainer.eval_steps: ODE only, the kernel is unused

    @property
    def probes_reference(self) -> bool:
        """A probe of the plan or of the sampler reads the frozen reference's weights."""
        return self.selector.needs_reference or self.sampler.needs_reference

    @property
    def needs_reference(self) -> bool:
        """The policy must keep a frozen reference (a probe or the loss reads it)."""
        return self.probes_reference or self.loss.needs_reference

    def stateful(self) -> dict[str, Any]:
        """Every part whose ``state_dict`` a checkpoint keeps (a stateful estimator or reward resumes like a
        selector), by its checkpoint name."""
        parts: dict[str, Any] = {"selector": self.selector, "sampler": self.sampler, "kernel": self.kernel,
                                 "advantage": self.estimator, "loss": self.loss, "prompts": self.prompts}
        return {**parts, **self.rewards.stateful()}


def build_parts(recipe: Recipe, device: torch.device) -> RunParts:
    """Build and check every part of ``recipe`` (see the module's docstring for the order), the backbone on
    ``device``."""
    rewards = RewardPhase(recipe)
    check_trackers(recipe.trainer.loggers)
    prompts = recipe.build("prompts")
    check_source(prompts, recipe.parts["backbone"])  # its condition images suit the base, before it loads
    check_reward_conditions(recipe, prompts)  # a reward that reads the source gets prompts with one
    selector = recipe.build("selector")  # the order of the builds is kept: a part may draw from torch's generator
    sampler = overlapped(recipe.build("sampler"), rewards.rewards, recipe.trainer.overlap_chunks)
    estimator, loss, kernel = recipe.build("advantage"), recipe.build("loss"), recipe.build("kernel")
    backbone: Backbone = recipe.build("backbone")
    backbone.to(device)
    grid = recipe.schedule
    schedule = Schedule(sigmas=backbone.schedule_sigmas(grid.num_steps, grid.shift), kernel=kernel)
    eval_schedule = Schedule(sigmas=backbone.schedule_sigmas(recipe.trainer.eval_steps, grid.shift), kernel=kernel)
    return RunParts(rewards, prompts, selector, sampler, estimator, loss, kernel, backbone, schedule, eval_schedule)
