"""The recipe's rewards: built and checked before the model loads, and applied to a rollout's images."""

from __future__ import annotations

import torch

from flowrl.errors import part_failure
from flowrl.interfaces import RewardError, RewardModel
from flowrl.recipe import Recipe
from flowrl.rewards.frames import score_pictures
from flowrl.types import RewardBatch, Rollout


def reward_models(recipe: Recipe) -> list[tuple[str, float, RewardModel]]:
    """The recipe's reward models, built and checked (no backbone needed)."""
    models = [(r.name, r.weight, r.build()) for r in recipe.rewards]
    for _, _, model in models:
        model.check()
    return models


def score_rollout(rewards: list[tuple[str, float, RewardModel]], rollout: Rollout) -> RewardBatch:
    """Every reward's scores of the rollout's images; a reward that fails, or returns anything but a tensor of
    one score per image, is a :class:`RewardError` naming it."""
    images, texts = rollout.images, rollout.rollout_texts()
    scores = {}
    for name, _, reward in rewards:
        try:
            raw = score_pictures(reward, images, texts)  # a clip: the mean over its frames (or the clip)
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
    return RewardBatch(scores=scores, weights={name: w for name, w, _ in rewards})
