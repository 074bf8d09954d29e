"""The reward phase: the recipe's rewards, built and checked before the model loads, and applied to a
rollout's images (:class:`RewardPhase` owns them for a run)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from flowrl.config.recipe import Recipe
from flowrl.config.reward_weights import scheduled, weight_at
from flowrl.core.errors import part_failure
from flowrl.core.interfaces import RewardError, RolloutSampler
from flowrl.core.types import RewardBatch, Rollout
from flowrl.rewards.built import BuiltReward
from flowrl.rewards.frames import score_pictures

Precomputed = Callable[[str, Tensor], "Tensor | None"]  # (reward name, images) -> scores already computed, or None


class RewardPhase:
    """The run's rewards (:func:`reward_models`) and the scoring of each iteration's rollout. Scores the sampler
    declares it computed already (:meth:`flowrl.core.interfaces.RolloutSampler.precomputed_scores`: an overlapped
    rollout's) are taken as they are; nothing here asks what kind of sampler it is."""

    def __init__(self, recipe: Recipe) -> None:
        self.rewards = reward_models(recipe)

    def __call__(self, rollout: Rollout, sampler: RolloutSampler, step: int = 0) -> RewardBatch:
        """The rollout of iteration ``step`` scored, weighted by each reward's weight at ``step``."""
        return score_rollout(self.at(step), rollout, sampler.precomputed_scores)

    def at(self, step: int) -> list[BuiltReward]:
        """The rewards with their weights of iteration ``step`` (a weight schedule is a pure function of the step,
        so a resumed run weighs as an unbroken one)."""
        return [reward.at(step) for reward in self.rewards]

    def weight_figures(self, batch: RewardBatch) -> dict[str, float]:
        """``reward_weight/<name>``: the weight ``batch`` used, for each reward whose weight is scheduled."""
        return {f"reward_weight/{r.name}": batch.weights[r.name] for r in self.rewards if r.schedule is not None}

    def stateful(self) -> dict[str, Any]:
        """Each reward model under ``reward/<name>``: its state is checkpointed like a selector's."""
        return {f"reward/{reward.name}": reward.model for reward in self.rewards}


def reward_models(recipe: Recipe, step: int = 0) -> list[BuiltReward]:
    """The recipe's reward models, built and checked (no backbone needed), weighted as at iteration ``step``."""
    models = [BuiltReward(r.name, weight_at(r.weight, step), r.build(), scheduled(r.weight)) for r in recipe.rewards]
    for reward in models:
        reward.model.check()
    return models


def score_rollout(rewards: list[BuiltReward], rollout: Rollout, precomputed: Precomputed | None = None) -> RewardBatch:
    """Every reward's scores of the rollout's images; a reward that fails, or returns anything but a tensor of
    one score per image, is a :class:`RewardError` naming it. ``precomputed`` answers for rewards scored while
    the rollout ran (:mod:`flowrl.trainer.overlap`); its errors are the reward's."""
    images, texts = rollout.images, rollout.rollout_texts()
    scores = {}
    for built in rewards:
        name, reward = built.name, built.model
        try:
            raw = precomputed(name, images) if precomputed is not None else None
            if raw is None:
                # a clip: the mean over its frames (or the clip); a group-wise reward scores each group together
                raw = score_pictures(reward, images, texts, rollout.group)
        except (Exception, SystemExit) as error:  # sys.exit() in a reward is its failure, not the run's end
            raise RewardError(f"reward '{name}' ({type(reward).__name__}) failed: {part_failure(error)}") from error
        if not isinstance(raw, torch.Tensor):
            raise RewardError(
                f"reward '{name}' returned a {type(raw).__name__}; score() must return a tensor of shape"
                f" ({rollout.num_rollouts},)"
            )
        if raw.dtype.is_complex or raw.device.type == "meta":
            raise RewardError(f"reward '{name}' returned a {raw.dtype} tensor on {raw.device}; score() must return real"
                              " numbers (any device)")
        scores[name] = raw.float().cpu()  # any real dtype and device: one float32 score per image on the CPU
        if scores[name].shape != (rollout.num_rollouts,):
            raise RewardError(
                f"reward '{name}' returned shape {tuple(scores[name].shape)}, expected ({rollout.num_rollouts},)"
            )
    return RewardBatch(scores=scores, weights={r.name: r.weight for r in rewards})
