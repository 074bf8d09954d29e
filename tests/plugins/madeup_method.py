"""A made-up method written outside flowrl/, as a researcher would: its sampler attaches a per-rollout
field the core has never heard of (``Rollout.extras["brightness"]``) and its estimator reads it.

The estimator keeps a running mean of the brightness of every rollout it has seen (state, checkpointed) and
subtracts ``weight * (brightness - running mean)`` from the group-normalised advantage. With several
processes it must see every process's rollouts: the field has to be gathered with the rest of the batch.
"""

from __future__ import annotations

from typing import Any

import attrs

from flowrl import AdvantageEstimator, Advantages, PerRollout, RewardBatch, Rollout
from flowrl.parts.advantages import GroupNorm
from flowrl.parts.samplers.independent import IndependentSampler

FIELD = "brightness"


class BrightnessSampler(IndependentSampler):
    """Independent rollouts, each with its image's mean brightness attached."""

    def rollout(self, *args: Any, **kwargs: Any) -> Rollout:
        out = super().rollout(*args, **kwargs)
        out.extras[FIELD] = PerRollout(out.images.mean(dim=(1, 2, 3)).double())
        return out


class BrightnessBaseline(AdvantageEstimator):
    """Group-normalised rewards minus ``weight`` times the brightness above its running mean."""

    @attrs.frozen
    class Config:
        weight: float = 1.0

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.group_norm = GroupNorm(GroupNorm.Config())
        self.seen, self.total = 0, 0.0

    def __call__(self, rewards: RewardBatch, rollout: Rollout) -> Advantages:
        field = rollout.extras.get(FIELD)
        if not isinstance(field, PerRollout) or field.value.shape[0] != rollout.num_rollouts:
            raise ValueError(f"'{FIELD}' must hold one value per rollout of the batch this estimator sees")
        self.seen += int(field.value.shape[0])
        self.total += float(field.value.sum())
        base = self.group_norm(rewards, rollout)
        shift = self.config.weight * (field.value - self.total / self.seen)
        return Advantages(values=(base.values.double() - shift).float(), per_reward=base.per_reward)

    def state_dict(self) -> dict[str, Any]:
        return {"seen": self.seen, "total": self.total}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seen, self.total = int(state["seen"]), float(state["total"])
