"""The rollout phase of an iteration: the selector's plan, then the sampler's rollouts of the current policy.

Everything here runs without gradients, with the full weights in hand when sharded, and counts towards the
NFE (a selector's probes included). Two things may ride along with the sampling: the recompute-free update's
recording of the trained inputs' graphs (:class:`flowrl.trainer.retain.Retention`), and the lagged copy's
weights where the loss samples with them (:meth:`flowrl.trainer.policy.TrainedPolicy.sampling`). Before the
first rollout the memory pre-check is made again with the first plan (:class:`flowrl.trainer.memory.RolloutFits`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from flowrl.config.recipe import Recipe
from flowrl.core.rng import RolloutRNG, generator
from flowrl.core.types import Plan, Rollout
from flowrl.parts.selectors import observed_plan
from flowrl.trainer.lagged import samples_from_lagged
from flowrl.trainer.memory import RolloutFits
from flowrl.trainer.policy import TrainedPolicy
from flowrl.trainer.retain import Retention

if TYPE_CHECKING:
    from flowrl.trainer.parts import RunParts


class RolloutPhase:
    """Plans and rolls out one iteration's prompts (this process's slice of the global batch)."""

    def __init__(self, recipe: Recipe, parts: RunParts, policy: TrainedPolicy, retention: Retention,
                 fits: RolloutFits) -> None:
        self.recipe, self.selector, self.sampler, self.policy = recipe, parts.selector, parts.sampler, policy
        self.schedule, self.retention, self.fits = parts.schedule, retention, fits
        self.from_lagged = samples_from_lagged(parts.loss)
        # the frozen reference's weights too, when sharded, where a probe of the plan or the sampler uses them
        self.probes_reference = parts.probes_reference

    def __call__(self, prompts: list[str], step: int, first_row: int) -> tuple[Plan, Rollout]:
        """The plan and the rollout of iteration ``step``; ``first_row`` is the global index of the first prompt
        (each prompt draws its noise from its own stream, :class:`flowrl.core.rng.RolloutRNG`)."""
        seed, backbone = self.recipe.seed, self.policy.backbone
        backbone.module.eval()
        with torch.no_grad(), self.policy.inference(reference=self.probes_reference):
            plan = observed_plan(self.selector, backbone, prompts, self.schedule, step, generator(seed, step, "plan"),
                                 self.recipe.schedule.final_sde, self.recipe.parts["selector"].type)
            self.fits.check(len(prompts), plan)
            rng = RolloutRNG(seed, step, range(first_row, first_row + len(prompts)))
            with self.retention.recording(plan, self.schedule), self.policy.sampling(self.from_lagged):
                rollout = self.sampler.rollout(backbone, prompts, plan, self.schedule, rng)
        return plan, rollout
