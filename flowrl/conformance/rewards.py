"""Conformance of reward models (:class:`~flowrl.core.interfaces.RewardModel`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from flowrl.conformance.common import finite, finite_stats, require
from flowrl.core.interfaces import RewardModel

# Scores of float32 models move with the batch shape and the thread count (BLAS blocking, SIMD width) by about
# 1e-7 of their scale: 1.4e-6 measured for PickScore at about 10 between a batch of 4 and one image at a time,
# 1.4e-7 for ImageReward at about 0.3 (tests/conftest.py, SCORE_TOL). rtol 1e-5 with atol 1e-6 leaves a
# margin of about 10 and still fails when an image's score depends on its neighbours in the batch.
RTOL = 1e-5
ATOL = 1e-6


def check_reward(
    reward: RewardModel,
    images: Tensor,
    prompts: Sequence[str],
    bounds: tuple[float, float] | None = None,
    rtol: float = RTOL,
    atol: float = ATOL,
) -> Tensor:
    """Rules, on ``images`` ``(B, 3, H, W)`` in [0, 1] and one prompt each:

    - ``check()`` passes for a reward that can score (its weights are there);
    - ``score`` returns a float tensor of ``B`` finite scores, within the documented ``bounds`` (inclusive;
      pass the rescaled bounds where a config rescales), without changing the images (every reward of a
      recipe scores the same tensor);
    - deterministic: the same batch scores identically (a model left in training mode, with dropout, fails);
    - scoring the batch equals scoring the images one by one, up to ``rtol`` / ``atol`` (no image's score
      depends on the others in its batch; the trainer scores whatever batch a rollout makes);
    - ``eval_metrics`` gives finite numbers, ``score`` among them.

    Returns the scores."""
    prompts = list(prompts)
    require(images.dim() == 4 and images.shape[1] == 3 and images.shape[0] == len(prompts), reward,
            "the check needs images (B, 3, H, W) with one prompt each")
    reward.check()
    before = images.clone()
    scores = reward.score(images, prompts)
    b = images.shape[0]
    require(isinstance(scores, Tensor) and scores.is_floating_point() and tuple(scores.shape) == (b,), reward,
            f"score must return a float tensor of shape ({b},), one score per image")
    require(torch.equal(images, before), reward, "score must not change the images")
    require(finite(scores), reward, "scores must be finite")
    if bounds is not None:
        low, high = bounds
        inside = bool(((scores >= low) & (scores <= high)).all())
        require(inside, reward, f"scores must lie in the documented range [{low}, {high}], got {scores.tolist()}")
    again = reward.score(images, prompts)
    require(torch.equal(again, scores), reward, "the same images gave other scores (not deterministic)")
    one = torch.cat([reward.score(images[i : i + 1], prompts[i : i + 1]).reshape(-1) for i in range(b)])
    worst = float((one.double() - scores.double()).abs().max()) if b else 0.0
    require(bool(torch.allclose(one.double(), scores.double(), rtol=rtol, atol=atol)), reward,
            f"scoring the batch differs from scoring the images one by one (by up to {worst:.3g})")
    metrics = reward.eval_metrics(images, prompts)
    require(finite_stats(metrics) and "score" in metrics and math.isfinite(metrics["score"]), reward,
            "eval_metrics must give finite numbers, 'score' among them")
    return scores
