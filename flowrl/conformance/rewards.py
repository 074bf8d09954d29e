"""Conformance of reward models (:class:`~flowrl.core.interfaces.RewardModel`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from flowrl.conformance.common import finite, finite_stats, require
from flowrl.core.group_rewards import GroupReward, groups_by_prompt
from flowrl.core.interfaces import RewardModel
from flowrl.core.judges import PairwiseJudge

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
      depends on the others in its batch; the trainer scores whatever batch a rollout makes); for a group-wise
      reward (:class:`~flowrl.core.group_rewards.GroupReward`) the units are its groups (the images sharing a
      prompt): scoring the batch equals scoring each group alone, and the group ids the trainer passes
      (:meth:`~flowrl.core.group_rewards.GroupReward.score_groups`) give what the prompts alone give;
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
    if isinstance(reward, GroupReward):
        ids = groups_by_prompt(prompts)
        one = torch.zeros(b, dtype=torch.float64)
        for group in ids.unique():
            index = torch.nonzero(ids == group).flatten()
            one[index] = reward.score(images[index], [prompts[int(i)] for i in index]).double()
        unit = "each group (the images sharing a prompt) alone"
        by_ids = reward.score_groups(images, prompts, ids * 7 + 3)  # any ids: only which images share one counts
        require(torch.equal(by_ids, scores), reward, "score_groups with the prompts' groups differs from score")
    else:
        one = torch.cat([reward.score(images[i : i + 1], prompts[i : i + 1]).reshape(-1) for i in range(b)])
        unit = "the images one by one"
    worst = float((one.double() - scores.double()).abs().max()) if b else 0.0
    require(bool(torch.allclose(one.double(), scores.double(), rtol=rtol, atol=atol)), reward,
            f"scoring the batch differs from scoring {unit} (by up to {worst:.3g})")
    metrics = reward.eval_metrics(images, prompts)
    require(finite_stats(metrics) and "score" in metrics and math.isfinite(metrics["score"]), reward,
            "eval_metrics must give finite numbers, 'score' among them")
    return scores


def check_judge(judge: PairwiseJudge, first: Tensor, second: Tensor, prompts: Sequence[str]) -> Tensor:
    """Rules of a pairwise judge (:class:`~flowrl.core.judges.PairwiseJudge`), on pairs ``(first[k], second[k])``
    ``(K, 3, H, W)`` in [0, 1] with one prompt each:

    - ``check()`` passes for a judge that can run (its weights or its server are there);
    - ``compare`` returns a float tensor of ``K`` verdicts in [0, 1], without changing the images;
    - deterministic: the same pairs get the same verdicts;
    - judging the pairs together equals judging them one at a time (no verdict depends on the other pairs).

    Returns the verdicts."""
    prompts = list(prompts)
    k = len(prompts)
    require(first.shape == second.shape and first.dim() == 4 and first.shape[0] == k, judge,
            "the check needs two image batches (K, 3, H, W) with one prompt per pair")
    judge.check()
    before = (first.clone(), second.clone())
    verdicts = judge.compare(first, second, prompts)
    require(isinstance(verdicts, Tensor) and verdicts.is_floating_point() and tuple(verdicts.shape) == (k,), judge,
            f"compare must return a float tensor of shape ({k},), one verdict per pair")
    unchanged = torch.equal(first, before[0]) and torch.equal(second, before[1])
    require(unchanged, judge, "compare must not change the images")
    require(bool(((verdicts >= 0) & (verdicts <= 1)).all()), judge,
            f"verdicts must lie in [0, 1], got {verdicts.tolist()}")
    require(torch.equal(judge.compare(first, second, prompts), verdicts), judge,
            "the same pairs got other verdicts (not deterministic)")
    one = torch.cat([judge.compare(first[i : i + 1], second[i : i + 1], prompts[i : i + 1]).reshape(-1)
                     for i in range(k)])
    require(torch.equal(one, verdicts), judge, "judging the pairs together differs from judging them one at a time")
    return verdicts
