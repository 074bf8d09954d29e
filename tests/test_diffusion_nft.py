"""DiffusionNFT: the optimality weight, the implicit-policy loss and its gradient direction, the KL term,
and training through the shared loop's forward-process phase."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
from conftest import ROOT, shipped_tiny, tiny_recipe
from flowrl_zoo.diffusion_nft import DiffusionNFTLoss, adaptive_x0_loss, optimality, ramp_decay

import flowrl
from flowrl.config.recipe import recipe_from_dict
from flowrl.conformance import check_loss
from flowrl.core.types import ForwardProcessInputs, Schedule
from flowrl.trainer import Trainer


def nft(**config: object) -> DiffusionNFTLoss:
    return flowrl.build("loss", {"type": "diffusion_nft", **config})


def toy(advantage: float, n: int = 4, seed: int = 0) -> tuple[ForwardProcessInputs, torch.Tensor]:
    """Re-noised samples x0 and a velocity field whose x0_hat misses x0; returns the batch and v_old."""
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn(n, 3, 4, 4, generator=g)
    t = torch.rand(n, generator=g) * 0.8 + 0.1
    x_t = (1 - t)[:, None, None, None] * x0 + t[:, None, None, None] * torch.randn(n, 3, 4, 4, generator=g)
    v_old = torch.randn(n, 3, 4, 4, generator=g)
    batch = ForwardProcessInputs(
        x0=x0, x_t=x_t, t=t, v=v_old.clone().requires_grad_(True), v_old=v_old, advantages=torch.full((n,), advantage)
    )
    return batch, v_old


def with_v(batch: ForwardProcessInputs, v: torch.Tensor) -> ForwardProcessInputs:
    return ForwardProcessInputs(batch.x0, batch.x_t, batch.t, v, batch.v_old, batch.advantages, batch.v_ref)


def test_optimality_weight_is_in_unit_interval() -> None:
    a = torch.tensor([-100.0, -5.0, -2.5, 0.0, 2.5, 5.0, 100.0])
    r = optimality(a, 5.0)
    assert torch.equal(r, torch.tensor([0.0, 0.0, 0.25, 0.5, 0.75, 1.0, 1.0]))
    assert bool(((optimality(torch.randn(1000) * 10, 2.0) >= 0) & (optimality(torch.randn(1000) * 10, 2.0) <= 1)).all())


def test_loss_matches_the_formula() -> None:
    batch, v_old = toy(1.5)
    v = v_old + 0.1 * torch.randn(v_old.shape, generator=torch.Generator().manual_seed(1))
    beta, c = 0.4, 5.0
    loss, stats = nft(beta=beta, adv_clip=c).forward_process(with_v(batch, v))
    t = batch.t[:, None, None, None]
    x_pos = batch.x_t - t * (beta * v + (1 - beta) * v_old)
    x_neg = batch.x_t - t * ((1 + beta) * v_old - beta * v)

    def term(x: torch.Tensor) -> torch.Tensor:
        err = (x - batch.x0).flatten(1)
        return err.square().mean(1) / err.abs().mean(1).clamp(min=1e-5)

    r = 1.5 / (2 * c) + 0.5
    expected = c * (r * term(x_pos) / beta + (1 - r) * term(x_neg) / beta).mean()
    assert float(loss.detach()) == pytest.approx(float(expected), rel=1e-5)
    assert stats["nft/r_mean"] == pytest.approx(r)
    unscaled, _ = nft(beta=beta, adv_clip=c, scale_by_clip=False).forward_process(with_v(batch, v))
    assert float(unscaled.detach()) == pytest.approx(float(expected) / c, rel=1e-5)


@pytest.mark.parametrize("advantage", [3.0, -3.0])
def test_gradient_raises_the_likelihood_of_good_samples(advantage: float) -> None:
    """Moving x0_hat = x_t - t v toward x0 lowers the loss for a positive advantage and raises it for a negative
    one; a gradient step on v moves x0_hat toward (A > 0) or away from (A < 0) the sample."""
    batch, v_old = toy(advantage)
    t = batch.t[:, None, None, None]
    x0_hat = batch.x_t - t * v_old
    toward = v_old - 0.1 * (batch.x0 - x0_hat) / t  # x0_hat' = x0_hat + 0.1 (x0 - x0_hat)
    loss = nft(beta=0.5).forward_process(batch)[0]
    moved = nft(beta=0.5).forward_process(with_v(batch, toward))[0]
    assert (float(moved.detach()) < float(loss.detach())) == (advantage > 0)
    (grad,) = torch.autograd.grad(loss, batch.v)
    stepped = batch.x_t - t * (v_old - 1e-2 * grad)
    before, after = (x0_hat - batch.x0).norm(), (stepped - batch.x0).norm()
    assert (float(after) < float(before)) == (advantage > 0)


def test_zero_advantages_are_finite_and_give_no_gradient() -> None:
    batch, _ = toy(0.0)
    loss, stats = nft().forward_process(batch)
    (grad,) = torch.autograd.grad(loss, batch.v)
    assert math.isfinite(float(loss.detach())) and all(math.isfinite(v) for v in stats.values())
    assert float(grad.abs().max()) < 1e-6
    exact = ForwardProcessInputs(  # x0_hat == x0 exactly: the adaptive weight's floor keeps it finite
        batch.x0, batch.x0, batch.t, torch.zeros_like(batch.x0, requires_grad=True), torch.zeros_like(batch.x0),
        torch.ones(4),
    )
    loss = nft().forward_process(exact)[0]
    assert float(loss.detach()) == 0.0 and torch.isfinite(torch.autograd.grad(loss, exact.v)[0]).all()
    assert float(adaptive_x0_loss(batch.x0, batch.x0).sum()) == 0.0


def test_kl_term_and_reference_need() -> None:
    assert not nft().needs_reference and nft(kl_beta=0.1).needs_reference
    batch, v_old = toy(1.0)
    v_ref = v_old + 0.5
    base = nft().forward_process(batch)[0]
    with_ref = ForwardProcessInputs(batch.x0, batch.x_t, batch.t, batch.v, batch.v_old, batch.advantages, v_ref)
    loss, stats = nft(kl_beta=0.1).forward_process(with_ref)
    assert float(loss.detach()) == pytest.approx(float(base.detach()) + 0.1 * 0.25, rel=1e-5)
    assert stats["kl"] == pytest.approx(0.25)
    with pytest.raises(ValueError, match="v_ref"):
        nft(kl_beta=0.1).forward_process(batch)


def nft_recipe(**trainer: object) -> dict:
    data = tiny_recipe(**trainer)
    data["selector"] = {"type": "nft_rollouts"}
    data["loss"] = {"type": "diffusion_nft", "beta": 0.5, "kl_beta": 0.01}
    return data


def test_rollouts_record_no_transitions() -> None:
    schedule = Schedule((1.0, 0.6, 0.3, 0.0), flowrl.build("kernel", {"type": "flow_grpo_sde"}))
    for stochastic in (False, True):
        plan = flowrl.build("selector", {"type": "nft_rollouts", "stochastic": stochastic}).plan(
            schedule, 0, torch.Generator()
        )
        assert plan.trained == () and len(plan.units) == (3 if stochastic else 0)


def test_two_iterations_through_the_shared_trainer(tmp_path: Path) -> None:
    recipe = recipe_from_dict(nft_recipe(max_steps=2))
    trainer = Trainer(recipe, tmp_path / "run", quiet=True)
    initial = {n: p.detach().clone() for n, p in trainer.named_params}
    trainer.run()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(math.isfinite(r["loss"]) and r["grad_norm"] > 0 and 0 <= r["nft/r_mean"] <= 1 for r in rows)
    assert all("kl" in r for r in rows) and rows[0]["kl"] == pytest.approx(0.0, abs=1e-10)  # first step: v = v_ref
    assert rows[0]["nfe"] == 2 * 4 * 4  # ODE rollouts only: prompts x G x N
    assert any(not torch.equal(initial[n], p) for n, p in trainer.named_params)


def test_recipe_runs_two_iterations(tmp_path: Path) -> None:
    overrides = ["sampler.group_size=2"]
    recipe = shipped_tiny("diffusion_nft", overrides)
    Trainer(recipe, tmp_path / "run", quiet=True).run()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(math.isfinite(r["loss"]) for r in rows)


def test_paper_recipe_runs_on_the_tiny_sd3(tmp_path: Path) -> None:
    """recipes/sd3/diffusion_nft_hps.toml (CFG-free, LoRA) with the tiny SD3 in place of SD3.5-M."""
    import tomllib

    data = tomllib.loads((ROOT / "recipes" / "sd3" / "diffusion_nft_hps.toml").read_text())
    assert data["backbone"]["guidance_scale"] == 1.0
    data["backbone"] = {"type": "tiny_sd3", "resolution": 16, "num_layers": 1, "guidance_scale": 1.0}
    data["prompts"] = {"type": "list", "prompts": ["a red circle", "a cat"]}
    data["reward"] = [{"type": "jpeg_compressibility"}]
    data["sampler"]["group_size"] = 2
    data["trainer"] = {"max_steps": 1, "prompts_per_step": 1, "checkpoint_every": 0, "image_every": 0}
    Trainer(recipe_from_dict(data), tmp_path / "run", quiet=True).run()
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["nfe"] == 2 * 10 and math.isfinite(row["loss"]) and row["grad_norm"] > 0


# -- the official code's lagged old policy and several noise levels per rollout -----------------------------------
def test_decay_schedules_follow_the_official_ramps() -> None:
    """The defaults are the official general schedule (0.001 a step, capped at 0.5); its OCR schedule waits 75 steps,
    then 0.0075 a step up to 0.999. Exact: products of small integers and binary-inexact rates compared as floats."""
    default = nft(old_policy="lagged")
    assert [default.lagged_decay(k) for k in (0, 1, 100, 499)] == [0.0, 0.001, pytest.approx(0.1), pytest.approx(0.499)]
    assert default.lagged_decay(500) == 0.5 and default.lagged_decay(10_000) == 0.5
    ocr = [ramp_decay(k, 75, 0.0075, 0.999) for k in (0, 74, 75, 76, 100, 208, 10_000)]
    assert ocr[:3] == [0.0, 0.0, 0.0] and ocr[3] == pytest.approx(0.0075) and ocr[4] == pytest.approx(0.1875)
    assert ocr[5] == pytest.approx(0.9975) and ocr[6] == 0.999
    assert nft().lagged_decay(0) is None and nft().lagged_decay(100) is None  # "rollout": no copy kept


@pytest.mark.parametrize("shift", [1.0, 3.0])
def test_levels_take_one_time_in_each_bin_per_rollout(shift: float) -> None:
    k, n = 5, 23  # 4 whole blocks and a cut one of 3
    loss = nft(levels=k, level_shift=shift)
    assert loss.levels() == k and nft().levels() == 1
    t = loss.sample_times(n, torch.Generator().manual_seed(3))
    assert t.shape == (n,) and bool(((t > 0) & (t < 1)).all())
    assert torch.equal(t, loss.sample_times(n, torch.Generator().manual_seed(3)))
    u = t.double() / (shift - (shift - 1.0) * t.double())  # undo the shift
    bins = (u * k).floor().long()
    for block in range(4):
        assert sorted(bins[block * k:(block + 1) * k].tolist()) == list(range(k))
    assert len(set(bins[20:].tolist())) == 3  # the cut block: distinct bins too
    if shift > 1:  # the shift moves the levels towards noise: mean of s u / (1 + (s - 1) u) over u uniform is 0.65
        many = nft(levels=4, level_shift=shift).sample_times(4000, torch.Generator().manual_seed(0))
        assert float(many.mean()) == pytest.approx(3 / 2 - 3 * math.log(3) / 4, rel=0.03)


def test_default_times_are_the_base_uniform_draw() -> None:
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert torch.equal(nft().sample_times(9, g1), torch.rand(9, generator=g2).clamp(1e-3, 1 - 1e-3))


@pytest.mark.parametrize(
    "options", [{}, {"old_policy": "lagged"}, {"levels": 3, "level_shift": 3.0}, {"old_policy": "lagged", "levels": 2}]
)
def test_conformance_with_each_option(options: dict) -> None:
    check_loss(nft(**options))
    check_loss(nft(kl_beta=0.1, **options))


def recorded_run(tmp_path: Path, loss: dict) -> tuple[Trainer, list[ForwardProcessInputs], dict[str, torch.Tensor]]:
    """Two iterations on the tiny model, each micro-batch the loss saw kept (detached), and the initial weights."""
    trainer = nft_trainer(tmp_path, loss)
    initial = {n: p.detach().clone() for n, p in trainer.named_params}
    seen = record_batches(trainer)
    trainer.run()
    return trainer, seen, initial


def nft_trainer(tmp_path: Path, loss: dict) -> Trainer:
    data = nft_recipe(max_steps=2)
    data["loss"].update(loss)
    return Trainer(recipe_from_dict(data), tmp_path / "run", quiet=True)


def record_batches(trainer: Trainer) -> list[ForwardProcessInputs]:
    """From now on each micro-batch the loss sees is kept (detached) in the returned list."""
    seen: list[ForwardProcessInputs] = []
    real = trainer.loss_fn.forward_process

    def record(batch: ForwardProcessInputs) -> tuple[torch.Tensor, dict[str, float]]:
        kept: dict[str, Any] = {f.name: getattr(batch, f.name) for f in attrs.fields(ForwardProcessInputs)}
        copies: dict[str, Any] = {k: None if v is None else v.detach().clone() for k, v in kept.items()}
        seen.append(ForwardProcessInputs(**copies))
        return real(batch)

    trainer.loss_fn.forward_process = record  # type: ignore[method-assign]
    return seen


def test_levels_repeat_each_rollout_in_one_update(tmp_path: Path) -> None:
    k = 3
    _, seen, _ = recorded_run(tmp_path, {"levels": k, "level_shift": 3.0})
    rollouts = 2 * 4  # prompts_per_step x G per iteration
    per_step = len(seen) // 2
    for step in (seen[:per_step], seen[per_step:]):
        rows = sum(b.x0.shape[0] for b in step)
        assert rows == k * rollouts
        x0 = torch.cat([b.x0 for b in step]).reshape(rollouts, k, -1)
        t = torch.cat([b.t for b in step]).reshape(rollouts, k)
        adv = torch.cat([b.advantages for b in step]).reshape(rollouts, k)
        group = torch.cat([b.group for b in step if b.group is not None]).reshape(rollouts, k)
        assert torch.equal(x0, x0[:, :1].expand_as(x0))  # the k rows of a rollout: one clean latent...
        assert torch.equal(adv, adv[:, :1].expand_as(adv)) and torch.equal(group, group[:, :1].expand_as(group))
        assert all(len(set(row.tolist())) == k for row in t)  # ...at k distinct noise levels
        assert all(b.x_t.shape == b.x0.shape == b.v.shape for b in step)


def test_lagged_copy_is_the_old_velocity(tmp_path: Path) -> None:
    """A decay of 1 from the first step keeps the copy at the initial weights: the first update sees v_old = v
    (same weights), the second a v_old that differs; the copy stays exactly the initial weights. With the
    rollout policy v_old is v's detached value at every step."""
    keep = {"old_policy": "lagged", "decay_rate": 1.0, "decay_max": 1.0}
    lagged, seen, initial = recorded_run(tmp_path / "lagged", keep)
    half = len(seen) // 2
    assert all(torch.equal(b.v_old, b.v) for b in seen[:half])
    assert all(not torch.equal(b.v_old, b.v) for b in seen[half:])
    assert lagged.policy.lagged is not None
    changed = 0
    for name, p in lagged.named_params:
        assert torch.equal(lagged.policy.lagged.shadow[name], initial[name])
        changed += int(not torch.equal(lagged.policy.lagged.shadow[name], p.detach()))
    assert changed > 0
    rollout, seen, _ = recorded_run(tmp_path / "rollout", {})
    assert rollout.policy.lagged is None and all(torch.equal(b.v_old, b.v) for b in seen)


def test_the_old_policy_samples_the_rollouts_when_asked(tmp_path: Path) -> None:
    """sampler_policy = "old" with a copy kept at the initial weights (decay 1): the first rollout is the one the
    trained policy draws (the copy equals the weights), the second is the initial policy's at that step, bit for
    bit, and differs from the trained policy's; the trained weights are back in place after each sampling."""
    keep = {"old_policy": "lagged", "decay_rate": 1.0, "decay_max": 1.0}
    old, seen_old, initial = recorded_run(tmp_path / "old", {**keep, "sampler_policy": "old"})
    _, seen_new, _ = recorded_run(tmp_path / "new", keep)
    half = len(seen_old) // 2

    def x0(seen: list[ForwardProcessInputs]) -> torch.Tensor:
        return torch.cat([b.x0 for b in seen])

    assert torch.equal(x0(seen_old[:half]), x0(seen_new[:half]))
    assert not torch.equal(x0(seen_old[half:]), x0(seen_new[half:]))
    fresh = nft_trainer(tmp_path / "fresh", keep)  # the initial weights, drawing the second iteration's rollout
    seen_fresh = record_batches(fresh)
    fresh.step = 1
    fresh.iteration()
    assert torch.equal(x0(seen_fresh), x0(seen_old[half:]))
    assert any(not torch.equal(p.detach(), initial[n]) for n, p in old.named_params)  # trained, not the copy


def test_old_policy_sampling_needs_the_lagged_copy() -> None:
    with pytest.raises(flowrl.RecipeError, match=r"\[loss.sampler_policy\] 'old' samples with the lagged copy"):
        data = nft_recipe(max_steps=2)
        data["loss"]["sampler_policy"] = "old"
        recipe_from_dict(data)


@pytest.mark.parametrize("overrides", [
    ["loss.old_policy=lagged"], ["loss.levels=3", "loss.level_shift=3.0"],
    ["loss.old_policy=lagged", "loss.sampler_policy=old", "loss.levels=9", "loss.level_shift=3.0"],  # official form
])
def test_recipe_runs_two_iterations_with_each_option(tmp_path: Path, overrides: list[str]) -> None:
    recipe = shipped_tiny("diffusion_nft", ["sampler.group_size=2", *overrides])
    Trainer(recipe, tmp_path / "run", quiet=True).run()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(math.isfinite(r["loss"]) and r["grad_norm"] > 0 for r in rows)
