"""Flow-DPPO: the closed-form step KL, the direction-aware divergence mask, the unclipped surrogate inside the
trust region, and masked transitions contributing nothing."""

from __future__ import annotations

import math

import torch
from flowrl_zoo.flow_dppo import mean_kl, outside_trust_region

import flowrl
from flowrl.core.interfaces import gaussian_log_prob
from flowrl.core.types import LossInputs


def dppo(**config: object) -> flowrl.PolicyLoss:
    return flowrl.build("loss", {"type": "flow_dppo", **config})


def test_mean_kl_is_the_gaussian_kl_per_dimension() -> None:
    g = torch.Generator().manual_seed(0)
    mean, old = torch.randn(3, 2, 5, generator=g), torch.randn(3, 2, 5, generator=g)
    std = torch.tensor([0.3, 0.7, 1.1])
    ours = mean_kl(mean, old, std)
    for i in range(3):
        p = torch.distributions.Normal(old[i].flatten(), std[i])
        q = torch.distributions.Normal(mean[i].flatten(), std[i])
        full = torch.distributions.kl_divergence(p, q).sum()
        assert math.isclose(float(ours[i]), float(full) / 10, rel_tol=1e-5)
    assert torch.equal(mean_kl(mean, old, std), mean_kl(old, mean, std))  # one std: symmetric


def test_expected_log_ratio_is_minus_the_kl() -> None:
    """For x' from the old step, E[logp_new - logp_old] = -KL (per dimension): the ratio sits below 1."""
    g = torch.Generator().manual_seed(1)
    n, dim = 20000, 8
    old, mean = torch.zeros(n, dim), 0.1 * torch.ones(n, dim)
    std = torch.full((n,), 0.5)
    x = old + 0.5 * torch.randn(n, dim, generator=g)
    log_ratio = gaussian_log_prob(x, mean, std) - gaussian_log_prob(x, old, std)
    kl = float(mean_kl(mean, old, std)[0])
    assert math.isclose(float(log_ratio.mean()), -kl, rel_tol=0.1)


def test_the_mask_drops_only_moves_further_out() -> None:
    """Ratios [1.2, 0.8, 1.2, 0.8] with advantages [10, -10, -8, 8], all beyond the threshold: the first two move
    further the way their advantage pushes and are dropped, the last two come back and pass; below the threshold
    nothing is dropped; a KL equal to the threshold counts as outside."""
    ratio = torch.tensor([1.2, 0.8, 1.2, 0.8])
    adv = torch.tensor([10.0, -10.0, -8.0, 8.0])
    kl = torch.full((4,), 0.02)
    assert outside_trust_region(kl, ratio, adv, 0.01).tolist() == [True, True, False, False]
    assert not outside_trust_region(kl, ratio, adv, 0.03).any()
    assert outside_trust_region(kl, ratio, adv, 0.02).tolist() == [True, True, False, False]
    assert not outside_trust_region(kl, torch.ones(4), adv, 0.0).any()  # ratio exactly 1 passes


def _batch(shift: float, adv: torch.Tensor) -> tuple[LossInputs, torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    n = adv.shape[0]
    old = torch.randn(n, 16, generator=g)
    std = torch.full((n,), 0.4)
    x = old + 0.4 * torch.randn(n, 16, generator=g)
    mean = (old + shift * torch.randn(n, 16, generator=g)).requires_grad_(True)
    batch = LossInputs(log_prob=gaussian_log_prob(x, mean, std), old_log_prob=gaussian_log_prob(x, old, std),
                       advantages=adv, weight=torch.ones(n), mean=mean, std=std, dt=torch.full((n,), -0.1),
                       old_mean=old)
    return batch, mean


def test_inside_the_region_it_is_the_unclipped_surrogate() -> None:
    adv = torch.tensor([1.0, -2.0, 0.5, 3.0])
    batch, _ = _batch(0.05, adv)
    value, stats = dppo(threshold=1e6)(batch)
    expected = (-adv * torch.exp(batch.log_prob - batch.old_log_prob)).mean()
    assert stats["clip_frac"] == 0.0
    assert math.isclose(float(value.detach()), float(expected.detach()), rel_tol=1e-6)


def test_masked_transitions_give_no_gradient_and_still_count() -> None:
    adv = torch.tensor([1.0, -2.0, 0.5, 3.0])
    batch, mean = _batch(0.3, adv)  # far outside 1e-5
    value, stats = dppo(threshold=1e-5)(batch)
    value.backward()
    ratio = torch.exp(batch.log_prob - batch.old_log_prob).detach()
    dropped = ((adv > 0) & (ratio > 1)) | ((adv < 0) & (ratio < 1))
    assert dropped.any() and (~dropped).any(), "the seed should give both kinds"
    assert math.isclose(stats["clip_frac"], float(dropped.float().mean()))
    assert float(mean.grad[dropped].abs().max()) == 0.0
    assert float(mean.grad[~dropped].abs().min(dim=1).values.min()) >= 0 and float(mean.grad[~dropped].abs().sum()) > 0
    kept = (-adv * ratio)[~dropped].sum() / 4  # the mean divides by every transition, masked ones included
    assert math.isclose(float(value.detach()), float(kept.detach()), rel_tol=1e-6)


def test_raising_the_threshold_only_keeps_more() -> None:
    adv = torch.randn(64, generator=torch.Generator().manual_seed(3))
    batch, _ = _batch(0.02, adv)
    fractions = [dppo(threshold=tau)(batch)[1]["clip_frac"] for tau in (1e-6, 1e-4, 1e-3, 1e-2, 1.0)]
    assert fractions == sorted(fractions, reverse=True) and fractions[0] > fractions[-1]
