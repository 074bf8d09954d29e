"""Per-iteration health signals: within-group diversity and the share of groups that add no policy gradient."""

from __future__ import annotations

import pytest
import torch

from flowrl.trainer.health import HealthAlerts, rollout_health


def test_diversity_is_the_mean_rms_distance_within_groups() -> None:
    c = 0.25
    base = torch.rand(3, 8, 8, generator=torch.Generator().manual_seed(0)) * 0.5
    # group 0: three images, two equal and one brighter by c everywhere; group 1: two equal images
    images = torch.stack([base, base, base + c, base, base])
    group = torch.tensor([0, 0, 0, 1, 1])
    advantages = torch.tensor([-1.0, 0.0, 1.0, 0.0, 0.0])
    health = rollout_health(images, group, advantages)
    # group 0: ordered pairs (0,1) 0, (0,2) c, (1,2) c, twice each over 6 ordered pairs -> 2c/3; group 1: 0
    assert health["health/diversity"] == pytest.approx((2 * c / 3 + 0.0) / 2, rel=1e-5)
    assert health["health/zero_spread"] == 0.5  # group 1's advantages are zero


def test_zero_spread_counts_the_advantages_not_the_totals() -> None:
    """Two rewards normalised one by one, then summed with weights 2 and 1: a group whose totals are all equal
    (b = -2a) still gets non-zero advantages, and adds to the gradient."""
    from types import SimpleNamespace

    from flowrl.core.types import RewardBatch
    from flowrl.parts.advantages import GroupNorm

    a = torch.tensor([0.0, 1.0, 2.0, 3.0])
    rewards = RewardBatch({"a": a, "b": -2 * a}, {"a": 2.0, "b": 1.0})
    assert float(rewards.total.abs().max()) == 0.0
    group = torch.zeros(4, dtype=torch.long)
    estimator = GroupNorm(GroupNorm.Config(multi_reward="normalize_then_sum"))
    values = estimator(rewards, SimpleNamespace(group=group)).values  # type: ignore[arg-type]  # reads .group only
    assert float(values.abs().min()) > 0.1
    assert rollout_health(torch.rand(4, 3, 4, 4), group, values)["health/zero_spread"] == 0.0
    same = estimator(RewardBatch({"a": torch.ones(4), "b": torch.ones(4)}, {"a": 2.0, "b": 1.0}),
                     SimpleNamespace(group=group))  # type: ignore[arg-type]
    assert rollout_health(torch.rand(4, 3, 4, 4), group, same.values)["health/zero_spread"] == 1.0


def test_large_images_are_pooled_before_the_distance() -> None:
    images = torch.zeros(2, 3, 256, 256)
    images[1] += 0.5
    health = rollout_health(images, torch.tensor([0, 0]), torch.tensor([0.0, 1.0]))
    assert health["health/diversity"] == pytest.approx(0.5, rel=1e-5)  # a constant shift survives pooling
    assert health["health/zero_spread"] == 0.0


def test_single_image_groups_give_no_signal() -> None:
    assert rollout_health(torch.rand(2, 3, 4, 4), torch.tensor([0, 1]), torch.zeros(2)) == {}


def test_diversity_alert_starts_once_and_clears() -> None:
    alerts = HealthAlerts(diversity_share=0.5, eval_falls=0, diversity_window=1)  # each value against the first
    started = []
    flags = []
    for d in (1.0, 0.6, 0.4, 0.3, 0.8, 0.45):
        metrics = {"health/diversity": d}
        started.append(len(alerts.observe(metrics, None)))
        flags.append(metrics.get("alert/diversity", 0))
    assert flags == [0, 0, 1, 1, 0, 1]
    assert started == [0, 0, 1, 0, 0, 1]  # a message when it starts, not in every row


def test_diversity_alert_compares_window_means() -> None:
    """The mean of the last 3 diversities against the mean of the first 3: one low iteration (a noisy figure)
    does not fire it, a sustained fall does; a low first value does not set a low reference."""
    alerts = HealthAlerts(diversity_share=0.7, eval_falls=0, diversity_window=3)
    values = (0.6, 1.2, 1.2, 0.5, 1.0, 1.0, 0.6, 0.6, 0.6)  # reference 1.0: the first value alone would be 0.6
    flags = []
    for d in values:
        metrics = {"health/diversity": d}
        alerts.observe(metrics, None)
        flags.append(metrics.get("alert/diversity", 0))
    # means of the last 3 from the third value on: 1.0, 0.967, 0.9, 0.833, 0.867, 0.733, 0.6 (below 0.7 at the end)
    assert flags == [0, 0, 0, 0, 0, 0, 0, 0, 1]


def test_reward_vs_eval_alert_needs_rising_reward_and_falling_evaluation() -> None:
    alerts = HealthAlerts(diversity_share=0.0, eval_falls=2)
    # (training reward, evaluation figure or None): evaluations at every second iteration
    steps = [(0.1, 0.50), (0.2, None), (0.3, 0.45), (0.4, None), (0.5, 0.40), (0.6, None), (0.6, 0.42)]
    flags, messages = [], []
    for reward, figure in steps:
        metrics = {"reward/total": reward}
        messages += alerts.observe(metrics, None if figure is None else ("eval/strict", figure))
        flags.append(metrics.get("alert/reward_vs_eval", 0))
    # the third evaluation completes two rises of the reward with two falls of the figure; the fourth clears it
    assert flags == [0, 0, 0, 0, 1, 1, 0]
    assert len(messages) == 1 and "eval/strict fell over the last 2 evaluations (0.5000 -> 0.4000)" in messages[0]
    flat = HealthAlerts(diversity_share=0.0, eval_falls=2)
    for reward, figure in [(0.1, 0.5), (0.1, 0.45), (0.1, 0.4)]:  # evaluation falls, reward does not rise
        metrics = {"reward/total": reward}
        assert not flat.observe(metrics, ("eval/strict", figure)) and "alert/reward_vs_eval" not in metrics
