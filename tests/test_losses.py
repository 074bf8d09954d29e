import math
import tomllib
from pathlib import Path

import pytest
import torch
from conftest import ROOT

from flowrl.config.recipe import load_recipe
from flowrl.core.types import LossInputs
from flowrl.parts.losses import PPOClip, ppo_clip_objective

E = 1e-4


def _inputs(log_prob, old, adv, weight=None, mean=None, std=None, ref_mean=None) -> LossInputs:
    t = log_prob.shape[0]
    return LossInputs(
        log_prob=log_prob,
        old_log_prob=old,
        advantages=adv,
        weight=torch.ones(t) if weight is None else weight,
        mean=torch.zeros(t, 2, 3) if mean is None else mean,
        std=torch.full((t,), 0.5) if std is None else std,
        ref_mean=ref_mean,
    )


def _loss(**kw) -> PPOClip:
    return PPOClip(PPOClip.Config(**kw))


def test_on_policy_ratio_is_one() -> None:
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(16, generator=g) * 3
    adv, weight = torch.randn(16, generator=g), torch.rand(16, generator=g)
    loss, stats = _loss()(_inputs(logp.clone().requires_grad_(True), logp, adv, weight))
    # exact: logp - logp is 0 and exp(0) is 1
    assert stats["ratio_mean"] == 1.0 and stats["clip_frac"] == 0.0 and stats["approx_kl"] == 0.0
    assert loss.item() == pytest.approx(float(-(adv * weight).mean()), abs=1e-7)
    assert "kl" not in stats


def test_clipping_by_hand() -> None:
    ratios = torch.tensor([1.0, 1 + 3 * E, 1 - 3 * E, 1 + 3 * E, 1 - 3 * E, 1 + E / 2])
    adv = torch.tensor([1.0, 1.0, 1.0, -1.0, -1.0, 2.0])
    per, ratio = ppo_clip_objective(torch.log(ratios), torch.zeros(6), adv, E)
    torch.testing.assert_close(ratio, ratios)
    # A > 0: min(r, clip(r)) is used (gain capped above); A < 0: max(r, clip(r)) (loss uncapped above)
    want = torch.tensor([-1.0, -(1 + E), -(1 - 3 * E), 1 + 3 * E, 1 - E, -2 * (1 + E / 2)])
    # the ratios come back through exp(log r) in float32, to an ulp or two (libm and the vectorised SLEEF exp/log
    # round differently); a wrong clip moves a value by >= 2 E = 2e-4: rtol 1e-6
    torch.testing.assert_close(per, want, atol=0, rtol=1e-6)
    _, stats = _loss(clip_range=E)(_inputs(torch.log(ratios), torch.zeros(6), adv))
    assert stats["clip_frac"] == pytest.approx(4 / 6)
    diffs = torch.log(ratios).double()
    assert stats["approx_kl"] == pytest.approx(float(0.5 * diffs.square().mean()), rel=1e-5)


def test_gradient_flows_only_where_unclipped() -> None:
    ratios = torch.tensor([1.0, 1 + 3 * E, 1 - 3 * E])
    logp = torch.log(ratios).requires_grad_(True)
    adv = torch.tensor([1.0, 1.0, 1.0])
    weight = torch.tensor([2.0, 1.0, 1.0])
    loss, _ = _loss(clip_range=E)(_inputs(logp, torch.zeros(3), adv, weight))
    loss.backward()
    assert logp.grad is not None
    # d/dlogp of -A w r / T = -A w r / T on unclipped rows; 0 on the clipped one (r > 1 + e, A > 0)
    torch.testing.assert_close(logp.grad, torch.tensor([-2.0 / 3, 0.0, -(1 - 3 * E) / 3]))


def test_kl_term_and_reference() -> None:
    assert not _loss().needs_reference and not _loss(kl_beta=0.0).needs_reference
    assert _loss(kl_beta=0.04).needs_reference
    g = torch.Generator().manual_seed(1)
    logp = torch.randn(4, generator=g)
    adv = torch.randn(4, generator=g)
    mean = torch.randn(4, 2, 3, generator=g).requires_grad_(True)
    std = torch.tensor([0.5, 0.2, 0.7, 1.0])
    base, _ = _loss(kl_beta=0.0)(_inputs(logp, logp, adv, mean=mean, std=std, ref_mean=mean.detach() + 1))
    same, stats = _loss(kl_beta=0.04)(_inputs(logp, logp, adv, mean=mean, std=std, ref_mean=mean.detach()))
    assert stats["kl"] == 0.0 and same.item() == base.item()  # exact: mean - ref_mean is 0, so is the KL term
    ref = mean.detach() + 0.3
    off, stats = _loss(kl_beta=0.04)(_inputs(logp, logp, adv, mean=mean, std=std, ref_mean=ref))
    want_kl = (0.09 / (2 * std.double() ** 2)).mean()
    assert stats["kl"] == pytest.approx(float(want_kl), rel=1e-5) and stats["kl"] > 0
    assert off.item() == pytest.approx(base.item() + 0.04 * float(want_kl), rel=1e-5)
    off.backward()
    assert mean.grad is not None and torch.isfinite(mean.grad).all() and mean.grad.abs().sum() > 0


def test_kl_dt_factor_scales_by_minus_dt() -> None:
    logp = torch.zeros(2)
    batch = _inputs(logp, logp, torch.ones(2), ref_mean=torch.ones(2, 2, 3))
    with pytest.raises(ValueError, match="dt"):
        _loss(kl_beta=0.1, kl_dt_factor=True)(batch)
    plain = _loss(kl_beta=0.1)(batch)[1]["kl"]
    batch.dt = torch.tensor([-0.5, -0.5])
    scaled = _loss(kl_beta=0.1, kl_dt_factor=True)(batch)[1]["kl"]
    assert plain > 0 and scaled == pytest.approx(0.5 * plain, rel=1e-6)


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        PPOClip.Config(clip_range=0.0)
    with pytest.raises(ValueError):
        PPOClip.Config(kl_beta=-1.0)
    assert math.isclose(PPOClip.Config().clip_range, 1e-4)


PAPER_KL_RECIPES = sorted(  # the PPO-clip recipes with a KL term (DiffusionNFT's KL is another term)
    p
    for p in (ROOT / "recipes").rglob("*.toml")
    if (loss := tomllib.loads(p.read_text()).get("loss", {})).get("kl_beta", 0) > 0 and loss.get("type") == "ppo_clip"
)


def test_some_paper_recipes_set_a_kl() -> None:
    assert {p.name for p in PAPER_KL_RECIPES} >= {"flow_grpo_hps.toml", "tempflow_grpo_hps.toml"}


@pytest.mark.parametrize("path", PAPER_KL_RECIPES, ids=lambda p: str(p.relative_to(ROOT)))
def test_paper_recipes_apply_the_official_kl_strength(path: Path) -> None:
    """The official Flow-GRPO code's KL, re-derived: mean over dims of (mean - ref_mean)^2 / (2 sigma_t^2),
    sigma_t = a sqrt(s / (1 - s)), the kernel's noise scale without sqrt(-dt)."""
    recipe = load_recipe(path)
    loss, kernel = recipe.build("loss"), recipe.build("kernel")
    g = torch.Generator().manual_seed(0)
    x, v, v_ref = (torch.randn(3, 4, 8, generator=g) for _ in range(3))
    s, s_next = torch.full((3,), 0.75), torch.full((3,), 2 / 3)
    mean, std = kernel.mean_std(x, v, s, s_next, 0.964)
    ref_mean = kernel.mean_std(x, v_ref, s, s_next, 0.964)[0]
    batch = _inputs(torch.zeros(3), torch.zeros(3), torch.ones(3), mean=mean, std=std, ref_mean=ref_mean)
    batch.dt = s_next - s
    a = kernel.config.noise_level
    sigma_t = a * math.sqrt(0.75 / 0.25)
    official = float(((mean - ref_mean).double() ** 2).mean() / (2 * sigma_t**2))
    assert loss(batch)[1]["kl"] == pytest.approx(official, rel=1e-5)  # fp32 sums of ~100 terms
