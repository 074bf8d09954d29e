"""GRPO-Guard: the normalised log-ratio's identity and noise-level independence, the 1 / |dt| reweighting that
equalises the velocity gradient across steps, the clip on the normalised ratio, and the declared scale."""

from __future__ import annotations

import math

import pytest
import torch
from flowrl_zoo.grpo_guard import normalised_log_ratio

import flowrl
from flowrl.core.interfaces import gaussian_log_prob
from flowrl.core.types import LossInputs

D = (3, 8, 8)


def guard(**config: object) -> flowrl.PolicyLoss:
    return flowrl.build("loss", {"type": "grpo_guard", **config})


def step(s: float, s_next: float, v: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The Flow-GRPO kernel's mean and std for one step of every row (noise level 0.7)."""
    kernel = flowrl.build("kernel", {"type": "flow_grpo_sde", "noise_level": 0.7})
    n = x.shape[0]
    return kernel.mean_std(x, v, torch.full((n,), s), torch.full((n,), s_next), s_at_one=0.9)


@pytest.mark.parametrize("s", [0.02, 0.2, 1.5])
def test_normalised_log_ratio_is_the_noise_dot_the_mean_shift(s: float) -> None:
    """``s (logp - logp_old) + mean(d^2) / (2 s) = mean(eps * d)`` exactly, whatever the std."""
    g = torch.Generator().manual_seed(0)
    old = torch.randn(5, *D, generator=g, dtype=torch.float64)
    eps = torch.randn(5, *D, generator=g, dtype=torch.float64)
    d = 0.01 * torch.randn(5, *D, generator=g, dtype=torch.float64)
    std = torch.full((5,), s, dtype=torch.float64)
    x = old + s * eps
    raw = gaussian_log_prob(x, old + d, std) - gaussian_log_prob(x, old, std)
    got = normalised_log_ratio(raw.double(), old + d, old, std).double()
    # the fp32 log-density rounds at ~1e-7 of its ~1-sized terms; times s, against an O(1e-2) result
    torch.testing.assert_close(got, (eps * d).flatten(1).mean(1), rtol=0, atol=1e-6 * max(1.0, s))


def test_the_raw_ratio_shifts_with_the_noise_level_and_the_normalised_one_does_not() -> None:
    """Over many noises: the raw log-ratio's mean is -mean(d^2)/(2 s^2), the normalised one's 0, and its spread
    is the same at two noise levels 10x apart."""
    g = torch.Generator().manual_seed(1)
    n = 4000
    d = 0.05 * torch.randn(1, 64, generator=g, dtype=torch.float64).expand(n, 64)
    old = torch.zeros(n, 64, dtype=torch.float64)
    spreads = []
    for s in (0.05, 0.5):
        eps = torch.randn(n, 64, generator=g, dtype=torch.float64)
        std = torch.full((n,), s, dtype=torch.float64)
        x = old + s * eps
        raw = (-((x - d) ** 2) + x**2).mean(1) / (2 * s**2)
        assert math.isclose(float(raw.mean()), -float(d[0].square().mean()) / (2 * s**2), rel_tol=0.1)
        normed = normalised_log_ratio(raw, d, old, std).double()
        assert abs(float(normed.mean())) < 4 * float(normed.std()) / math.sqrt(n)
        spreads.append(float(normed.std()))
    expected = float(d[0].norm()) / 64  # ||d|| / D
    for spread in spreads:
        assert math.isclose(spread, expected, rel_tol=0.05)


def _centre_batch(s: float, s_next: float, seed: int) -> tuple[LossInputs, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, *D, generator=g)
    v = torch.randn(4, *D, generator=g).requires_grad_(True)
    mean, std = step(s, s_next, v, x)
    noise = torch.randn(4, *D, generator=torch.Generator().manual_seed(99))
    x_next = (mean + std.reshape(-1, 1, 1, 1) * noise).detach()
    log_prob = gaussian_log_prob(x_next, mean, std)
    advantages = torch.tensor([1.0, -0.5, 2.0, 0.3])
    batch = LossInputs(log_prob=log_prob, old_log_prob=log_prob.detach(), advantages=advantages, weight=torch.ones(4),
                       mean=mean, std=std, dt=torch.full((4,), s_next - s), old_mean=mean.detach())
    return batch, v


def test_reweighting_equalises_the_velocity_gradient_across_steps() -> None:
    """With the Flow-GRPO kernel the mean moves with v by (1 + a^2/2) dt: RatioNorm and 1/|dt| leave the same
    gradient per unit of velocity at a high- and a low-noise step (same noise, same advantages); plain PPO's
    differs between them by ``std_low / std_high * dt_high / dt_low``-like factors."""
    grads, plain = [], []
    for s, s_next in ((0.9, 0.75), (0.2, 0.17)):
        for loss, out in ((guard(), grads), (flowrl.build("loss", {"type": "ppo_clip"}), plain)):
            batch, v = _centre_batch(s, s_next, seed=3)
            loss(batch)[0].backward()
            out.append(v.grad.clone())
    # float32 means of O(1) terms: ~1e-6 relative
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-7)
    ratio = float(plain[1].norm() / plain[0].norm())
    assert ratio > 1.5, f"plain PPO's low-noise step should dominate, got a ratio {ratio}"


def test_the_shift_keeps_its_gradient() -> None:
    """Off the centre, d log r' / d mean = eps / D (the shift's gradient cancels the raw ratio's d-term); with the
    shift detached it would be (eps - d / s) / D."""
    g = torch.Generator().manual_seed(4)
    old = torch.randn(3, 16, generator=g)
    eps = torch.randn(3, 16, generator=g)
    std = torch.tensor([0.1, 0.3, 0.6])
    x = old + std[:, None] * eps
    mean = (old + 0.05 * torch.randn(3, 16, generator=g)).requires_grad_(True)
    raw = gaussian_log_prob(x, mean, std) - gaussian_log_prob(x, old, std)
    normalised_log_ratio(raw, mean, old, std).sum().backward()
    torch.testing.assert_close(mean.grad, eps / 16, rtol=1e-4, atol=1e-6)


def test_the_clip_acts_on_the_normalised_ratio() -> None:
    """A positive advantage whose normalised ratio left 1 + e gets no gradient; inside it does."""
    e = 1e-3
    loss = guard(clip_range=e, reweight="none")
    g = torch.Generator().manual_seed(5)
    old = torch.randn(2, 16, generator=g)
    eps = torch.ones(2, 16)
    std = torch.tensor([0.5, 0.5])
    x = old + std[:, None] * eps
    shift = torch.tensor([[10 * e], [0.1 * e]]).expand(2, 16)  # <eps, d> = 10 e (outside), 0.1 e (inside)
    mean = (old + shift).requires_grad_(True)
    log_prob = gaussian_log_prob(x, mean, std)
    batch = LossInputs(log_prob=log_prob, old_log_prob=gaussian_log_prob(x, old, std), advantages=torch.ones(2),
                       weight=torch.ones(2), mean=mean, std=std, dt=torch.full((2,), -0.1), old_mean=old)
    value, stats = loss(batch)
    value.backward()
    assert stats["clip_frac"] == 0.5
    assert float(mean.grad[0].abs().max()) == 0.0 and float(mean.grad[1].abs().max()) > 0


def test_the_declared_scale_and_the_switches() -> None:
    std, dt = torch.tensor([0.2, 0.4]), torch.tensor([-0.1, -0.05])
    torch.testing.assert_close(guard().gradient_scale(std, dt), std / dt.abs())
    torch.testing.assert_close(guard(reweight="none").gradient_scale(std, dt), std)
    torch.testing.assert_close(guard(ratio_norm=False).gradient_scale(std, dt), 1 / dt.abs())
    assert guard().needs_old_mean and not guard(ratio_norm=False).needs_old_mean
