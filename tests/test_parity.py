"""The official codes' formulas and settings on fixed inputs (docs/algorithms.md, "Against the official code").

Each expected value is worked out here from the formula as the official code states it, in float64, not taken
from flowrl; the tests pin what the parity table claims.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler

import flowrl
from flowrl.core.interfaces import gaussian_log_prob
from flowrl.core.schedule import shifted_sigmas
from flowrl.core.types import ForwardProcessInputs
from flowrl.parts.advantages import group_normalize


def test_flow_grpo_last_step_on_the_sd3_grid_is_nearly_deterministic() -> None:
    """The diffusers SD3 grid at 10 steps, shift 3, ends at 0.0089, so the official last SDE step has std
    a s / sqrt(1 - s) = 0.0063; on the uniform shifted grid the same step would have std 0.20."""
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0)
    scheduler.set_timesteps(10)
    sd3 = [float(s) for s in scheduler.sigmas]
    kernel = flowrl.build("kernel", {"type": "flow_grpo_sde", "noise_level": 0.7})

    def last_std(grid: list[float]) -> float:
        s, x = torch.tensor([grid[-2]]), torch.zeros(1, 2)
        return float(kernel.mean_std(x, x, s, torch.zeros(1), grid[1])[1][0])

    s9 = sd3[-2]
    assert s9 == pytest.approx(0.00893, abs=1e-5)
    assert last_std(sd3) == pytest.approx(0.7 * s9 / math.sqrt(1 - s9), rel=1e-5)
    assert last_std(sd3) == pytest.approx(0.00628, abs=1e-5)
    uniform = [float(s) for s in shifted_sigmas(10, 3.0)]
    assert last_std(uniform) == pytest.approx(0.7 * 0.25 / math.sqrt(0.75), rel=1e-5)  # 0.202
    # the s = 1 guard (the grid's second level in 1 - s) makes the first step's std exactly a
    s = torch.tensor([1.0])
    std0 = kernel.mean_std(torch.zeros(1, 2), torch.zeros(1, 2), s, torch.tensor([sd3[1]]), sd3[1])[1]
    assert float(std0[0]) == pytest.approx(0.7, rel=1e-6)


def test_merged_jump_is_one_flow_grpo_step_over_the_span() -> None:
    """E-GRPO's merged unit (4, 3) on the 16-step grid: one Euler-Maruyama jump s_4 -> s_7 with the drift and
    std of s_4 (the release's step function with the larger dt), and its log-density averaged over dimensions."""
    sig = shifted_sigmas(16, 3.0).numpy()
    rng = np.random.default_rng(0)
    x, v, eps = (rng.standard_normal((2, 3, 4)) for _ in range(3))
    s, s_next, a = sig[4], sig[7], 0.7
    dt = s_next - s
    sigma_t = a * math.sqrt(s / (1 - s))
    mean = x * (1 + sigma_t**2 * dt / (2 * s)) + v * (1 + sigma_t**2 * (1 - s) / (2 * s)) * dt
    std = sigma_t * math.sqrt(-dt)
    x_next = mean + std * eps
    log_density = (-((x_next - mean) ** 2) / (2 * std**2) - math.log(std) - 0.5 * math.log(2 * math.pi)).mean((1, 2))
    kernel = flowrl.build("kernel", {"type": "flow_grpo_sde", "noise_level": a})
    t = {k: torch.tensor(val, dtype=torch.float32) for k, val in {"x": x, "v": v}.items()}
    got_mean, got_std = kernel.mean_std(t["x"], t["v"], torch.full((2,), s), torch.full((2,), s_next), sig[1])
    np.testing.assert_allclose(got_mean.numpy(), mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_std.numpy(), [std, std], rtol=1e-6)
    got_lp = gaussian_log_prob(torch.tensor(x_next, dtype=torch.float32), got_mean, got_std)
    np.testing.assert_allclose(got_lp.numpy(), log_density, rtol=1e-5)


def test_dance_grpo_step_and_the_image_it_scores() -> None:
    """DanceGRPO's step: ODE part x + v dt plus -(eta^2 / 2) score dt with score = -(x - (1 - s) x0_hat) / s^2;
    std eta sqrt(s - s_next). Its scored image is x0_hat = x - s v at the last input, which is exactly what an
    Euler step to 0 gives (flowrl's last step since ``final_sde``)."""
    rng = np.random.default_rng(1)
    x, v = rng.standard_normal((2, 5)), rng.standard_normal((2, 5))
    s, s_next, eta = 0.6, 0.45, 0.3
    x0_hat = x - s * v
    score = -(x - (1 - s) * x0_hat) / s**2
    mean = x + v * (s_next - s) - 0.5 * eta**2 * score * (s_next - s)
    kernel = flowrl.build("kernel", {"type": "dance_grpo_sde", "eta": eta})
    ode = flowrl.build("kernel", {"type": "ode"})
    tx, tv = torch.tensor(x, dtype=torch.float32), torch.tensor(v, dtype=torch.float32)
    got_mean, got_std = kernel.mean_std(tx, tv, torch.full((2,), s), torch.full((2,), s_next), 0.97)
    np.testing.assert_allclose(got_mean.numpy(), mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_std.numpy(), [eta * math.sqrt(s - s_next)] * 2, rtol=1e-6)
    last = ode.mean_std(tx, tv, torch.full((2,), s), torch.zeros(2), 0.97)[0]
    np.testing.assert_allclose(last.numpy(), x0_hat, rtol=1e-5, atol=1e-6)


def test_advantage_conventions() -> None:
    """E-GRPO's and DanceGRPO's release: per group (r - mean) / (unbiased std + 1e-8). flowrl's E-GRPO
    default (biased std + 1e-4) is that times sqrt(G / (G - 1)) while std >> eps: 4.5% larger at G = 12."""
    rng = np.random.default_rng(2)
    g, groups = 12, 3
    r = rng.uniform(0, 1, g * groups)
    ids = np.repeat(np.arange(groups), g)
    want = np.concatenate([(r[ids == k] - r[ids == k].mean()) / (r[ids == k].std(ddof=1) + 1e-8) for k in range(3)])
    want = np.clip(want, -5, 5)
    tr, tid = torch.tensor(r), torch.tensor(ids)
    official = group_normalize(tr, tid, eps=1e-8, unbiased=True).numpy()
    np.testing.assert_allclose(official, want, rtol=1e-10)
    shipped = group_normalize(tr, tid, eps=1e-4).numpy()
    ratio = shipped / official
    np.testing.assert_allclose(ratio, math.sqrt(g / (g - 1)), rtol=2e-3)  # eps 1e-4 against a std near 0.3
    # Flow-GRPO: per-prompt mean, the std of all rewards (biased) + 1e-4
    flow = (r - np.array([r[ids == k].mean() for k in range(3)])[ids]) / (r.std() + 1e-4)
    np.testing.assert_allclose(group_normalize(tr, tid, eps=1e-4, global_std=True).numpy(), np.clip(flow, -5, 5),
                               rtol=1e-10)


def test_ppo_clip_loss_and_gradient_by_hand() -> None:
    """mean max(-A r, -A clip(r)) with r = exp(lp - lp_old): the gradient in lp is -A r / n where the
    unclipped term is the larger, else 0."""
    from flowrl.core.types import LossInputs

    lp_old = torch.zeros(4, dtype=torch.float32)
    delta = torch.tensor([0.0, 5e-5, 3e-4, -3e-4])
    adv = torch.tensor([1.0, -2.0, 1.5, 1.5])
    lp = (lp_old + delta).requires_grad_(True)
    loss_fn = flowrl.build("loss", {"type": "ppo_clip", "clip_range": 1e-4})
    batch = LossInputs(log_prob=lp, old_log_prob=lp_old, advantages=adv, weight=torch.ones(4),
                       mean=torch.zeros(4, 1), std=torch.ones(4), ref_mean=None, dt=None)
    loss, _ = loss_fn(batch)
    loss.backward()
    r = np.exp(delta.numpy().astype(np.float64))
    a = adv.numpy().astype(np.float64)
    terms = np.maximum(-a * r, -a * np.clip(r, 1 - 1e-4, 1 + 1e-4))
    assert float(loss.detach()) == pytest.approx(terms.mean(), rel=1e-6)
    unclipped = -a * r >= -a * np.clip(r, 1 - 1e-4, 1 + 1e-4)
    want = np.where(unclipped, -a * r / 4, 0.0)
    # row 2 (r above 1 + e with A > 0) is clipped; row 3 (r below 1 - e with A > 0) is not
    assert list(unclipped) == [True, True, False, True]
    np.testing.assert_allclose(lp.grad.numpy(), want, rtol=1e-5)


@pytest.mark.parametrize("beta", [0.25, 1.0, 4.0])
def test_diffusion_nft_beta_is_inert_when_v_old_is_v(beta: float) -> None:
    """With v_old = v (flowrl's one on-policy step) the gradient is c (2r - 1) times the adaptive regression
    gradient, whatever beta is: the documented difference from the release's lagged old policy."""
    g = torch.Generator().manual_seed(3)
    x0, eps = torch.randn(4, 2, 3, generator=g), torch.randn(4, 2, 3, generator=g)
    t = torch.tensor([0.2, 0.5, 0.7, 0.9])
    x_t = (1 - t[:, None, None]) * x0 + t[:, None, None] * eps
    base = torch.randn(4, 2, 3, generator=g)
    adv = torch.tensor([2.0, -1.0, 0.5, -4.0])
    loss_fn = flowrl.build("loss", {"type": "diffusion_nft", "beta": beta, "adv_clip": 5.0})
    v = base.clone().requires_grad_(True)
    loss, _ = loss_fn.forward_process(ForwardProcessInputs(x0=x0, x_t=x_t, t=t, v=v, v_old=v.detach(),
                                                           advantages=adv, v_ref=None))
    loss.backward()
    # by hand: L = mean_d e^2 / sg(mean_d |e|), e = x_t - t v - x0; dL/dv = -t 2 e / (D mean|e|); times c (2r - 1) / n
    e = (x_t - t[:, None, None] * base - x0).double()
    d = e[0].numel()
    grad_rec = -t[:, None, None].double() * 2 * e / (d * e.flatten(1).abs().mean(1)[:, None, None])
    r = (adv.double() / 10 + 0.5).clamp(0, 1)
    want = 5.0 * (2 * r - 1)[:, None, None] * grad_rec / 4
    torch.testing.assert_close(v.grad.double(), want, rtol=1e-5, atol=1e-8)
