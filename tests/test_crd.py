"""CRD: prompt centring (the log-partition cancels), the fit's gradient at the lagged policy, the reward-adaptive
anchor, the lagged copy's decay schedule, and a short training run through the shared loop with its lagged
copy checkpointed."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from conftest import ROOT
from flowrl_zoo.crd import adaptive_velocity_error, group_centred

import flowrl
from flowrl.config.recipe import load_recipe
from flowrl.core.types import ForwardProcessInputs
from flowrl.trainer import Trainer


def crd(**config: object) -> flowrl.ForwardProcessLoss:
    return flowrl.build("loss", {"type": "crd", **config})


def toy(seed: int = 0, n: int = 6) -> ForwardProcessInputs:
    g = torch.Generator().manual_seed(seed)
    x0, eps = torch.randn(n, 3, 4, 4, generator=g), torch.randn(n, 3, 4, 4, generator=g)
    t = torch.rand(n, generator=g) * 0.8 + 0.1
    x_t = (1 - t)[:, None, None, None] * x0 + t[:, None, None, None] * eps
    v_old = eps - x0 + 0.3 * torch.randn(n, 3, 4, 4, generator=g)
    v = (v_old + 0.05 * torch.randn(n, 3, 4, 4, generator=g)).requires_grad_(True)
    adv = torch.tensor([1.0, -0.5, -0.5, 2.0, -1.0, -1.0])[:n]
    return ForwardProcessInputs(x0=x0, x_t=x_t, t=t, v=v, v_old=v_old, advantages=adv,
                                group=torch.tensor([0, 0, 0, 1, 1, 1])[:n])


def test_centring_removes_a_per_prompt_constant() -> None:
    values = torch.tensor([1.0, 2.0, 6.0, -1.0, 3.0])
    group = torch.tensor([4, 4, 4, 9, 9])
    centred = group_centred(values, group)
    torch.testing.assert_close(centred, torch.tensor([-2.0, -1.0, 3.0, -2.0, 2.0]))
    shifted = values + torch.tensor([7.0, 7.0, 7.0, -3.0, -3.0])  # log Z differs per prompt
    torch.testing.assert_close(group_centred(shifted, group), centred)


def test_the_loss_reads_the_implicit_reward_only_through_its_prompt_centred_value() -> None:
    """Moving one prompt's lagged velocity changes that prompt's implicit rewards; the loss then changes, but a
    per-prompt constant added to the implicit reward (a different log Z per prompt) would not move it: the
    loss is a function of group_centred values, checked by recomputing it from them."""
    batch, loss = toy(), crd(beta=0.7)
    value = float(loss.forward_process(batch)[0].detach())
    target = (batch.x_t - batch.x0) / batch.t[:, None, None, None]
    implicit = adaptive_velocity_error(batch.v_old, target) - adaptive_velocity_error(batch.v, target)
    a = batch.advantages / 10.0
    for shift in (torch.zeros(6), torch.tensor([5.0, 5.0, 5.0, -2.0, -2.0, -2.0])):
        centred = group_centred(implicit + shift, batch.group)
        assert math.isclose(float((5.0 / 0.7) * (0.7 * centred - a).square().mean()), value, rel_tol=1e-5)


def test_at_the_lagged_policy_the_gradient_is_advantage_weighted_matching() -> None:
    """v = v_old: l = 0, and the gradient is -(2 c / n) a^c grad l = (2 c / n) a^c grad e(v): rows with a positive
    advantage are pulled towards the target u = eps - x0, the others pushed away, in proportion to A."""
    batch = toy()
    v = batch.v_old.clone().requires_grad_(True)
    batch = ForwardProcessInputs(batch.x0, batch.x_t, batch.t, v, batch.v_old, batch.advantages, group=batch.group)
    loss = crd(adv_clip=5.0)
    value, stats = loss.forward_process(batch)
    assert stats["crd/implicit_abs"] == 0.0
    value.backward()
    target = (batch.x_t - batch.x0) / batch.t[:, None, None, None]
    leaf = v.detach().clone().requires_grad_(True)
    adaptive_velocity_error(leaf, target).sum().backward()  # grad e_i per row
    a = batch.advantages / 10.0
    expected = (2 * 5.0 / 6) * a[:, None, None, None] * leaf.grad
    torch.testing.assert_close(v.grad, expected, rtol=1e-5, atol=1e-8)


def test_equal_rewards_at_the_lagged_policy_give_no_gradient() -> None:
    batch = toy()
    v = batch.v_old.clone().requires_grad_(True)
    batch = ForwardProcessInputs(batch.x0, batch.x_t, batch.t, v, batch.v_old, torch.zeros(6), group=batch.group)
    crd().forward_process(batch)[0].backward()
    assert float(v.grad.abs().max()) == 0.0


def test_the_anchor_weight_grows_with_the_reward() -> None:
    """k_i = kl_min + (kl_beta - kl_min) a_i: 1e-4 at the clipped lowest advantage, kl_beta at the highest."""
    batch = toy()
    v_ref = batch.v.detach() + 1.0  # (v - v_ref)^2 = 1 everywhere
    batch = ForwardProcessInputs(batch.x0, batch.x_t, batch.t, batch.v, batch.v_old, torch.tensor([-5.0, 5.0] * 3),
                                 v_ref=v_ref, group=batch.group)
    with_kl = float(crd(kl_beta=0.1).forward_process(batch)[0])
    without = float(crd().forward_process(batch)[0])
    assert math.isclose(with_kl - without, (1e-4 + 0.1) / 2, rel_tol=1e-5)
    flat = float(crd(kl_beta=0.1, reward_adaptive=False).forward_process(batch)[0])
    assert math.isclose(flat - without, 0.1, rel_tol=1e-5)


def test_the_lagged_decay_schedule() -> None:
    loss = crd(decay_start=0.25, decay_slope=0.005, decay_max=0.999)
    assert loss.lagged_decay(0) == 0.25
    assert math.isclose(loss.lagged_decay(100), 0.75)
    assert loss.lagged_decay(10_000) == 0.999


def test_crd_trains_with_its_lagged_copy_and_resumes(tmp_path: Path) -> None:
    """Two iterations of the shipped recipe: the implicit reward is 0 at the first (the copy is the initial
    policy) and not after; the copy is in the checkpoint, blended by the schedule, and a resumed run loads it."""
    small = ["trainer.max_steps=2", "trainer.prompts_per_step=2", "trainer.eval_every=0", "trainer.image_every=0",
             "trainer.checkpoint_every=2", "trainer.max_minutes=0"]
    recipe = load_recipe(ROOT / "recipes" / "crd.toml", small)
    trainer = Trainer(recipe, tmp_path / "run", quiet=True)
    initial = {n: p.detach().clone() for n, p in trainer.named_params}
    trainer.run()
    lagged = trainer.policy.lagged
    assert lagged is not None
    # after step 1: old = 0.255 init + 0.745 theta_1; after step 2: 0.26 of that + 0.74 theta_2: neither end
    name, p = trainer.named_params[0]
    assert not torch.equal(lagged.shadow[name], initial[name]) and not torch.equal(lagged.shadow[name], p.detach())
    kept = {n: t.clone() for n, t in lagged.shadow.items()}
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["crd/implicit_abs"] == 0.0 and rows[1]["crd/implicit_abs"] > 0
    # the logged schedule and how far the weights ran ahead of the copy after the last blend
    assert [r["lagged/decay"] for r in rows[:2]] == [0.255, 0.26]
    diff = sum(float((q.detach() - kept[n]).square().sum()) for n, q in trainer.named_params)
    norm = sum(float(t.square().sum()) for t in kept.values())
    assert rows[0]["lagged/distance"] > 0
    assert math.isclose(rows[1]["lagged/distance"], (diff / norm) ** 0.5, rel_tol=1e-6)
    resumed = Trainer(load_recipe(ROOT / "recipes" / "crd.toml", [*small, "trainer.max_steps=3"]), tmp_path / "run",
                      quiet=True, resume=tmp_path / "run")
    try:
        assert resumed.policy.lagged is not None
        for n, t in kept.items():
            assert torch.equal(resumed.policy.lagged.shadow[n], t)
    finally:
        resumed.release()


def test_an_adaptive_anchor_that_falls_with_the_reward_is_refused(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """kl_min above kl_beta would weight the anchor less as the reward grows: a one-line error naming the file and
    loss.kl_min, exit 2, before anything is built."""
    from flowrl.cli.main import main

    recipe = tmp_path / "r.toml"
    recipe.write_text((ROOT / "recipes" / "crd.toml").read_text().replace("kl_min = 1e-4", "kl_min = 1.5"))
    assert main(["validate", str(recipe)]) == 2
    captured = capsys.readouterr()
    err = captured.err + captured.out
    assert str(recipe) in err and "[loss.kl_min]" in err and "Traceback" not in err


def test_a_sharded_run_with_a_lagged_copy_is_refused_before_anything_is_built(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """The lagged copy's weight swap needs unsharded weights: validate and train refuse CRD with
    trainer.sharding = "fsdp", exit 2, naming the file and the key; DiffusionNFT likewise with its shipped lagged
    copy, and validates sharded without it."""
    from flowrl.cli.main import main

    crd = str(ROOT / "recipes" / "crd.toml")
    for command in (["validate", crd], ["train", crd, "--output-dir", str(tmp_path / "run")]):
        assert main([*command, "--set", "trainer.sharding=fsdp"]) == 2
        captured = capsys.readouterr()
        err = captured.err + captured.out
        assert crd in err and "[trainer.sharding]" in err and "lagged copy" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()
    nft = str(ROOT / "recipes" / "diffusion_nft.toml")  # ships the lagged copy: refused too, and valid without it
    assert main(["validate", nft, "--set", "trainer.sharding=fsdp"]) == 2
    plain = ["--set", "loss.old_policy=rollout", "--set", "loss.sampler_policy=policy"]
    assert main(["validate", nft, "--set", "trainer.sharding=fsdp", *plain]) == 0
