"""Every advantage estimator and loss of every shipped recipe keeps its interface's rules (flowrl.conformance):
estimators on a real rollout of their recipe's sampler (tiny FLUX), losses on inputs built as the trainer
builds them; and each check catches a deliberately broken part."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
from test_conformance import PROMPTS, RECIPES, first_plan, loaded, recipe_id, tiny

import flowrl
from flowrl.conformance import ConformanceError, check_advantage, check_loss
from flowrl.core.registry import registry
from flowrl.core.rng import RolloutRNG
from flowrl.core.types import Advantages, RewardBatch, Rollout

# Registered parts' settings no shipped recipe uses, checked too (with the branch_grpo rollout for trees).
EXTRA_ADVANTAGES = {
    "branch_depthwise": {
        "node_reward": "logprob_softmax", "width_prune": "abs_advantage", "multi_reward": "normalize_then_sum"
    },
    "group_norm": {"clip": None, "unbiased": True, "multi_reward": "normalize_then_sum"},
}
EXTRA_LOSSES = {
    "diffusion_nft": {"beta": 0.5, "kl_beta": 0.1, "scale_by_clip": False, "adv_clip": 2.0},
    "ppo_clip": {"clip_range": 0.2, "kl_beta": 0.04, "kl_dt_factor": False},
    "grpo_guard": {"ratio_norm": False, "reweight": "none", "kl_beta": 0.01, "kl_dt_factor": True},
    "flow_dppo": {"threshold": 1e-9, "kl_beta": 0.01},
    "crd": {"beta": 0.3, "kl_beta": 0.1, "reward_adaptive": False, "decay_start": 0.0},
}
TREE_RECIPE = Path("branch_grpo.toml")


@functools.cache
def rollout(path: Path) -> Rollout:
    """A rollout of the recipe's own selector and sampler on the tiny FLUX model."""
    recipe, schedule = loaded(path)
    plan = first_plan(recipe, schedule)
    with torch.no_grad():
        return recipe.build("sampler").rollout(tiny(), PROMPTS, plan, schedule, RolloutRNG(0, 0, range(len(PROMPTS))))


@pytest.mark.parametrize("path", RECIPES, ids=recipe_id)
def test_advantage_and_loss_conform(path: Path) -> None:
    recipe = loaded(path)[0]
    from flowrl.config.reward_weights import weight_at

    # a scheduled weight at the run's last iteration, where every ramped-in reward has its weight
    weights = {r.name: weight_at(r.weight, recipe.trainer.max_steps) for r in recipe.rewards}
    out = check_advantage(recipe.build("advantage"), rollout(path), weights)
    assert out.values.shape == (rollout(path).num_rollouts,)
    check_loss(recipe.build("loss"))


@pytest.mark.parametrize("name", sorted(EXTRA_ADVANTAGES))
def test_advantage_settings_no_recipe_uses_conform(name: str) -> None:
    path = [p for p in RECIPES if p.name == TREE_RECIPE.name][0] if name == "branch_depthwise" else RECIPES[0]
    estimator = flowrl.build("advantage", {"type": name, **EXTRA_ADVANTAGES[name]})
    check_advantage(estimator, rollout(path), {"a": 1.0, "b": 0.5})


@pytest.mark.parametrize("name", sorted(EXTRA_LOSSES))
def test_loss_settings_no_recipe_uses_conform(name: str) -> None:
    check_loss(flowrl.build("loss", {"type": name, **EXTRA_LOSSES[name]}))


# -- the checks can fail ------------------------------------------------------------------------
class FirstRolloutBaseline(flowrl.AdvantageEstimator):
    """Reward minus the batch's first reward: depends on which group comes first."""

    @attrs.frozen
    class Config:
        pass

    def __call__(self, rewards: RewardBatch, rollout: Rollout) -> Advantages:
        total = rewards.total
        return Advantages(values=total - total[0])


class LowerIsBetter(FirstRolloutBaseline):
    """Group-centred, with the sign flipped."""

    def __call__(self, rewards: RewardBatch, rollout: Rollout) -> Advantages:
        total, group = rewards.total, rollout.group
        means = torch.stack([total[group == g].mean() for g in group])
        return Advantages(values=means - total)


@pytest.mark.parametrize(
    ("estimator", "rule"), [(FirstRolloutBaseline, "order of the groups"), (LowerIsBetter, "anti-correlate")]
)
def test_broken_estimators_are_caught(estimator: type, rule: str) -> None:
    with pytest.raises(ConformanceError, match=rule):
        check_advantage(estimator(estimator.Config()), rollout(RECIPES[0]))


PPO = registry("loss").get("ppo_clip")
NFT = registry("loss").get("diffusion_nft")


class SummedPPO(PPO):  # type: ignore[misc, valid-type]
    """Sums over transitions: the trainer's share weighting then counts every micro-batch wrongly."""

    def __call__(self, batch: Any) -> Any:
        loss, stats = super().__call__(batch)
        return loss * len(batch.log_prob), stats


class AscentPPO(PPO):  # type: ignore[misc, valid-type]
    """Climbs the surrogate: the policy gradient with the wrong sign."""

    def __call__(self, batch: Any) -> Any:
        loss, stats = super().__call__(batch)
        return -loss, stats


class StdWeightedPPO(PPO):  # type: ignore[misc, valid-type]
    """Weights each transition by its std without declaring it (gradient_scale): an undeclared step weighting."""

    def step_weight(self, batch: Any) -> Any:
        return batch.std.detach().float()


class GlobalTimesNFT(NFT):  # type: ignore[misc, valid-type]
    """Draws its noise levels from the global generator: a resumed run re-noises differently."""

    def sample_times(self, n: int, generator: torch.Generator) -> torch.Tensor:
        return torch.rand(n).clamp(1e-3, 1 - 1e-3)


class NegatedNFT(NFT):  # type: ignore[misc, valid-type]
    """Swaps the implicit positive and negative policies: good rollouts are pushed away."""

    def forward_process(self, batch: Any) -> Any:
        return super().forward_process(attrs.evolve(batch, advantages=-batch.advantages))


class LeakyPPO(PPO):  # type: ignore[misc, valid-type]
    """Lets a gradient into the old log-density (its value unchanged): the update would move the old policy."""

    def __call__(self, batch: Any) -> Any:
        loss, stats = super().__call__(batch)
        return loss + (batch.old_log_prob - batch.old_log_prob.detach()).mean(), stats


class LeakyNFT(NFT):  # type: ignore[misc, valid-type]
    """Lets a gradient into the advantages (its value unchanged): the update would move a learned reward too."""

    def forward_process(self, batch: Any) -> Any:
        loss, stats = super().forward_process(batch)
        return loss + (batch.advantages - batch.advantages.detach()).mean(), stats


@pytest.mark.parametrize(
    ("loss", "rule"),
    [
        (SummedPPO, "mean over transitions"),
        (LeakyPPO, "treat old_log_prob as a constant"),
        (LeakyNFT, "treat advantages as a constant"),
        (AscentPPO, "-k A w"),
        (StdWeightedPPO, "-k A w gradient_scale"),
        (GlobalTimesNFT, "only from its generator"),
        (NegatedNFT, "towards eps - x0"),
    ],
)
def test_broken_losses_are_caught(loss: type, rule: str) -> None:
    with pytest.raises(ConformanceError, match=rule):
        check_loss(loss(loss.Config()))
