"""Per-iteration health signals: within-group diversity and the share of groups without reward spread."""

from __future__ import annotations

import pytest
import torch

from flowrl.trainer.health import rollout_health


def test_diversity_is_the_mean_rms_distance_within_groups() -> None:
    c = 0.25
    base = torch.rand(3, 8, 8, generator=torch.Generator().manual_seed(0)) * 0.5
    # group 0: three images, two equal and one brighter by c everywhere; group 1: two equal images
    images = torch.stack([base, base, base + c, base, base])
    group = torch.tensor([0, 0, 0, 1, 1])
    total = torch.tensor([0.1, 0.2, 0.3, 0.5, 0.5])
    health = rollout_health(images, group, total)
    # group 0: ordered pairs (0,1) 0, (0,2) c, (1,2) c, twice each over 6 ordered pairs -> 2c/3; group 1: 0
    assert health["health/diversity"] == pytest.approx((2 * c / 3 + 0.0) / 2, rel=1e-5)
    assert health["health/zero_spread"] == 0.5  # group 1's rewards are equal


def test_large_images_are_pooled_before_the_distance() -> None:
    images = torch.zeros(2, 3, 256, 256)
    images[1] += 0.5
    health = rollout_health(images, torch.tensor([0, 0]), torch.tensor([0.0, 1.0]))
    assert health["health/diversity"] == pytest.approx(0.5, rel=1e-5)  # a constant shift survives pooling
    assert health["health/zero_spread"] == 0.0


def test_single_image_groups_give_no_signal() -> None:
    assert rollout_health(torch.rand(2, 3, 4, 4), torch.tensor([0, 1]), torch.zeros(2)) == {}
