"""The scalars one iteration logs: rewards, advantages, rollout health, the update's figures, the selector's
plan diagnostics, learning rate, timing and memory."""

from __future__ import annotations

from typing import Any

import torch

from flowrl.core.types import Advantages, Plan, RewardBatch, Rollout
from flowrl.trainer.health import rollout_health


def iteration_metrics(
    rollout: Rollout,
    rewards: RewardBatch,
    advantages: Advantages,
    plan: Plan,
    update: dict[str, float],
    seconds: dict[str, float],
) -> dict[str, Any]:
    """This process's figures of one iteration. ``seconds``: ``rollout``, ``update``, ``iteration`` and
    ``transformer`` (forwards and backwards), from which the share of time outside the transformer follows."""
    metrics: dict[str, Any] = {f"reward/{k}": float(v.mean()) for k, v in rewards.scores.items()}
    metrics["reward/total"] = float(rewards.total.mean())
    metrics["advantage/abs_mean"] = float(advantages.values.abs().mean())
    metrics.update({f"advantage/{k}/abs_mean": float(v.abs().mean()) for k, v in advantages.per_reward.items()})
    metrics.update(rollout_health(rollout.images, rollout.group, advantages.values))
    metrics.update(update)
    metrics.update(plan_scalars(plan))
    total, model = seconds["iteration"], seconds["transformer"]
    metrics.update({"time/rollout_s": seconds["rollout"], "time/update_s": seconds["update"]})
    metrics.update({"time/iteration_s": total, "time/transformer_s": model})
    metrics.update({"time/outside_share": max(0.0, 1 - model / total), "mem/peak_mb": peak_memory_mb()})
    return metrics


def plan_scalars(plan: Plan) -> dict[str, float]:
    """The numeric entries of ``plan.info`` (a selector's or allocator's diagnostics) as ``plan/<key>``;
    lists of numbers are summarised by their mean, min and max."""
    out: dict[str, float] = {}
    for key, value in plan.info.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[f"plan/{key}"] = float(value)
        elif isinstance(value, list | tuple) and value and all(isinstance(v, int | float) for v in value):
            numbers = [float(v) for v in value]
            out.update({f"plan/{key}/mean": sum(numbers) / len(numbers), f"plan/{key}/max": max(numbers)})
            out[f"plan/{key}/min"] = min(numbers)
    return out


def peak_memory_mb() -> float:
    """Peak memory so far: the GPU allocator's peak on CUDA, else the process's peak resident set."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
