"""The advantages of offline preference pairs: the labels the preference file gave."""

from __future__ import annotations

import attrs

from flowrl import register
from flowrl.core.contracts import needs
from flowrl.core.extras import PerRollout
from flowrl.core.interfaces import AdvantageEstimator
from flowrl.core.types import Advantages, RewardBatch, Rollout
from flowrl_zoo.diffusion_dpo.sampler import LABEL


@register("advantage", "preference")
class PreferenceLabels(AdvantageEstimator):
    """Each rollout's advantage is its preference label (``Rollout.extras["preference"]``: +1 preferred, -1
    rejected), whatever the rewards (which are still scored and logged: on the world, how the file's images fare).
    Diffusion-DPO then pairs the +1 image with the -1 image of each record."""

    reads_rewards = False  # the labels came with the pairs
    requires = (needs("preference_labels", "the labels come with offline pairs (sampler 'preference_file')"),)

    @attrs.frozen
    class Config:
        pass

    def __call__(self, rewards: RewardBatch, rollout: Rollout) -> Advantages:
        labels = rollout.extras.get(LABEL)
        if not isinstance(labels, PerRollout):
            raise ValueError(f"the preference estimator needs Rollout.extras[{LABEL!r}] (sampler 'preference_file')")
        return Advantages(values=labels.value.float().to(rewards.total.device))
