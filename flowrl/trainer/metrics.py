"""The scalars one iteration logs: rewards, advantages, rollout health, the update's figures, the selector's
plan diagnostics, learning rate, timing and memory."""

from __future__ import annotations

from typing import Any

from flowrl.trainer.health import rollout_health
from flowrl.trainer.support import peak_memory_mb, plan_scalars
from flowrl.types import Advantages, Plan, RewardBatch, Rollout


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
