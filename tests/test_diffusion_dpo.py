"""Diffusion-DPO for flow matching: the loss's properties, the pairs and their shared noise through the shared
trainer, the timestep distributions, the lagged reference, the offline preference file and its errors, and short
runs of the shipped recipes."""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
import torch
from conftest import ROOT, shipped_tiny
from flowrl_zoo.diffusion_dpo import (
    DiffusionDPOLoss,
    PreferenceFileError,
    dpo_loss,
    pair_times,
    preference_rows,
    read_preferences,
)
from flowrl_zoo.diffusion_dpo.world_pairs import write_world_edit_pairs, write_world_pairs
from PIL import Image

import flowrl
from flowrl.config.recipe import load_recipe
from flowrl.conformance import ConformanceError, check_loss
from flowrl.core.types import ForwardProcessInputs
from flowrl.trainer import Trainer
from flowrl.trainer.micro_batches import forward_process_losses


def dpo(**config: object) -> DiffusionDPOLoss:
    return flowrl.build("loss", {"type": "diffusion_dpo", **config})


def pairs_batch(pairs: int = 3, seed: int = 0, shape: tuple[int, ...] = (3, 4, 4)) -> dict[str, torch.Tensor]:
    """Rows 2k (preferred, advantage +1) and 2k + 1 (rejected, -1) re-noised with one t and one eps per pair."""
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn(2 * pairs, *shape, generator=g)
    eps = torch.randn(pairs, *shape, generator=g).repeat_interleave(2, 0)
    t = (torch.rand(pairs, generator=g) * 0.8 + 0.1).repeat_interleave(2)
    x_t = (1 - t)[:, None, None, None] * x0 + t[:, None, None, None] * eps
    v_ref = torch.randn(2 * pairs, *shape, generator=g)
    return {"x0": x0, "eps": eps, "t": t, "x_t": x_t, "v_ref": v_ref,
            "adv": torch.tensor([1.0, -1.0]).repeat(pairs), "draw": torch.arange(pairs).repeat_interleave(2)}


def inputs(b: dict[str, torch.Tensor], v: torch.Tensor) -> ForwardProcessInputs:
    return ForwardProcessInputs(x0=b["x0"], x_t=b["x_t"], t=b["t"], v=v, v_old=v.detach(), advantages=b["adv"],
                                v_ref=b["v_ref"], group=b["draw"], draw=b["draw"])


# -- the loss --------------------------------------------------------------------------------------
def test_loss_matches_the_formula_in_float64() -> None:
    b = pairs_batch()
    v = b["v_ref"] + 0.3 * torch.randn(b["v_ref"].shape, generator=torch.Generator().manual_seed(1))
    loss, stats = dpo(beta=100.0).forward_process(inputs(b, v))
    u = (b["eps"] - b["x0"]).double()
    d = (v.double() - u).flatten(1).square().mean(1) - (b["v_ref"].double() - u).flatten(1).square().mean(1)
    expected = -torch.nn.functional.logsigmoid(-50.0 * (d[0::2] - d[1::2])).mean()
    # float32 errors of magnitude ~1 and a logit ~50x their difference: ~1e-5 relative, well above rounding
    assert math.isclose(float(loss), float(expected), rel_tol=1e-4)
    assert 0.0 <= stats["dpo/accuracy"] <= 1.0


def test_policy_equal_to_reference_gives_log_two_and_the_analytic_gradient() -> None:
    b = pairs_batch()
    v = b["v_ref"].clone().requires_grad_(True)
    loss, stats = dpo(beta=100.0).forward_process(inputs(b, v))
    assert math.isclose(float(loss.detach()), math.log(2.0), rel_tol=1e-6)  # -log sigmoid(0), float32
    assert stats["dpo/logit"] == 0.0 and stats["dpo/accuracy"] == 0.0
    loss.backward()
    # d/dv of -log sigmoid(-(beta/2)(D_w - D_l)) at D_w = D_l: (beta/4) * (+-2 (v - u) / dims) / pairs
    u = b["eps"] - b["x0"]
    sign = torch.tensor([1.0, -1.0]).repeat(3)[:, None, None, None]
    expected = sign * 25.0 * 2.0 * (b["v_ref"] - u) / u[0].numel() / 3
    assert v.grad is not None
    torch.testing.assert_close(v.grad, expected, rtol=1e-5, atol=1e-7)


def test_identical_images_give_no_parameter_gradient() -> None:
    """At policy = reference the gradient is (beta/4)(grad err_w - grad err_l): zero only when the two images are
    the same (a model's parameters see the two terms cancel); a pair of two images gets a real gradient."""

    def weight_grad(same: bool) -> torch.Tensor:
        b = pairs_batch(pairs=1)
        if same:
            b["x0"][1], b["x_t"][1] = b["x0"][0], b["x_t"][0]
        layer = torch.nn.Linear(4, 4)
        torch.nn.init.normal_(layer.weight, generator=torch.Generator().manual_seed(0))
        v = layer(b["x_t"])
        b["v_ref"] = v.detach().clone()
        loss, _ = dpo().forward_process(inputs(b, v))
        loss.backward()
        assert math.isclose(float(loss.detach()), math.log(2.0), rel_tol=1e-6)
        assert layer.weight.grad is not None
        return layer.weight.grad

    real, cancelled = weight_grad(False), weight_grad(True)
    # float32 sums of terms ~10 cancel to a few ulps (~1e-6): far below the gradient of a real pair
    assert float(real.abs().max()) > 1.0
    assert float(cancelled.abs().max()) <= 1e-5 * float(real.abs().max())


def test_lowering_the_preferred_error_lowers_the_loss() -> None:
    b = pairs_batch()
    u = b["eps"] - b["x0"]
    base = dpo().forward_process(inputs(b, b["v_ref"].clone()))[0]
    towards = b["v_ref"].clone()
    towards[0::2] += 0.1 * (u[0::2] - towards[0::2])  # the preferred images' velocities nearer their targets
    away = b["v_ref"].clone()
    away[1::2] += 0.1 * (u[1::2] - away[1::2])  # the rejected images' nearer theirs
    assert float(dpo().forward_process(inputs(b, towards))[0]) < float(base)
    assert float(dpo().forward_process(inputs(b, away))[0]) > float(base)


def test_the_preferred_row_is_the_higher_advantage_whatever_its_place() -> None:
    b = pairs_batch()
    v = b["v_ref"] + 0.2 * torch.randn(b["v_ref"].shape, generator=torch.Generator().manual_seed(3))
    swap = torch.tensor([1, 0, 3, 2, 5, 4])
    swapped = {k: b[k][swap] if k not in ("eps", "draw") else b[k] for k in b}
    a = dpo().forward_process(inputs(b, v))[0]
    c = dpo().forward_process(inputs(swapped, v[swap]))[0]
    assert math.isclose(float(a), float(c), rel_tol=1e-6)  # the same pairs summed in another order


def test_beta_scales_the_logit() -> None:
    b = pairs_batch()
    v = b["v_ref"] + 0.05 * torch.randn(b["v_ref"].shape, generator=torch.Generator().manual_seed(2))
    g = torch.tensor(0.0)
    for beta in (50.0, 100.0, 400.0):
        err = (v - (b["eps"] - b["x0"])).flatten(1).square().mean(1)
        ref = (b["v_ref"] - (b["eps"] - b["x0"])).flatten(1).square().mean(1)
        per, logit = dpo_loss(err, ref, torch.tensor([0, 2, 4]), torch.tensor([1, 3, 5]), beta)
        if beta == 50.0:
            g = logit
        torch.testing.assert_close(logit, g * (beta / 50.0), rtol=1e-6, atol=0.0)  # linear in beta
        stats = dpo(beta=beta).forward_process(inputs(b, v))[1]
        assert math.isclose(stats["dpo/logit"], float(logit.mean()), rel_tol=1e-5)
        torch.testing.assert_close(per, -torch.nn.functional.logsigmoid(logit))


def test_rows_that_do_not_share_a_draw_are_refused() -> None:
    b = pairs_batch()
    b["draw"] = torch.arange(6)
    with pytest.raises(ValueError, match="share a noise draw"):
        dpo().forward_process(inputs(b, b["v_ref"]))


# -- pairs -----------------------------------------------------------------------------------------
def test_best_against_worst_and_ties_skipped() -> None:
    adv = torch.tensor([0.5, 2.0, -1.0, 0.0, 1.0, 1.0, 1.0, 1.0, -3.0, 3.0, 0.0, 0.0])
    prompt = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2])
    rollout, draw = preference_rows(adv, prompt, "best_worst")
    assert rollout.tolist() == [1, 2, 9, 8]  # prompt 1 ties throughout: no pair
    assert draw.tolist() == [0, 0, 1, 1]


def test_all_pairs_with_distinct_rewards() -> None:
    adv = torch.tensor([1.0, 1.0, 0.0, 2.0])
    rollout, draw = preference_rows(adv, torch.zeros(4, dtype=torch.long), "all")
    pairs = {(int(rollout[i]), int(rollout[i + 1])) for i in range(0, len(rollout), 2)}
    assert pairs == {(0, 2), (3, 0), (1, 2), (3, 1), (3, 2)}  # (0, 1) tie: skipped
    assert draw.tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    levels, draw3 = preference_rows(adv, torch.zeros(4, dtype=torch.long), "all", levels=3)
    assert levels.tolist()[:6] == rollout.tolist()[:2] * 3 and draw3.tolist()[:6] == [0, 0, 1, 1, 2, 2]


def test_no_pair_in_a_process_still_reaches_the_all_reduce_with_no_gradient() -> None:
    backbone = tiny_backbone()
    rollout = fake_rollout(backbone, 2, 4)
    loss = dpo()
    steps = list(forward_process_losses(backbone, loss, rollout, torch.zeros(8), 8, torch.Generator()))
    assert len(steps) == 1 and steps[0][1] == 0.0 and float(steps[0][0].detach()) == 0.0
    steps[0][0].backward()
    grads = [p.grad for p in backbone.transformer.parameters() if p.grad is not None]
    assert grads and all(float(g.abs().max()) == 0.0 for g in grads)  # a zero loss times the graph: exactly 0


def tiny_backbone() -> object:
    backbone = flowrl.build("backbone", {"type": "tiny_flux", "resolution": 16, "num_layers": 1,
                                         "num_single_layers": 1})
    return backbone


def fake_rollout(backbone: object, prompts: int, group: int) -> flowrl.Rollout:
    from flowrl.parts.samplers.walk import empty_transitions

    n = prompts * group
    latents = backbone.noise(n, torch.Generator().manual_seed(0))  # type: ignore[attr-defined]
    rows = torch.arange(prompts).repeat_interleave(group)
    texts = ["a red circle", "two blue squares"][:prompts]
    return flowrl.Rollout(prompts=texts, cond=backbone.encode(texts), images=torch.zeros(n, 3, 16, 16),  # type: ignore[attr-defined]
                          rollout_prompt=rows, group=rows.clone(), transitions=empty_transitions(), nfe=0,
                          final_latents=latents)


def test_the_trainer_gives_both_images_of_a_pair_one_t_and_one_eps() -> None:
    """Through the shared update: each pair's rows have equal t and equal eps (recovered from x_t); different
    pairs have different ones. A loss that drew per row would fail here."""
    backbone = tiny_backbone()
    rollout = fake_rollout(backbone, 2, 4)
    adv = torch.tensor([0.3, 1.0, -1.0, 0.1, 2.0, -0.5, 0.0, -2.0])
    seen: list[ForwardProcessInputs] = []
    loss = dpo(pairs="all")
    real = loss.forward_process

    def record(batch: ForwardProcessInputs) -> tuple[torch.Tensor, dict[str, float]]:
        seen.append(attrs.evolve(batch, v=batch.v.detach()))
        return real(batch)

    loss.forward_process = record  # type: ignore[method-assign]
    for _ in forward_process_losses(backbone, loss, rollout, adv, 8, torch.Generator().manual_seed(0),
                                  contextlib.nullcontext):
        pass
    assert sum(b.x0.shape[0] for b in seen) == 2 * 12  # 6 pairs a prompt, none tied
    for b in seen:
        t = b.t.reshape(-1, *[1] * (b.x0.dim() - 1))
        eps = (b.x_t - (1 - t) * b.x0) / t
        # eps recovered in float32 from magnitudes ~1 with t >= 1e-3: agreement to ~1e-4 absolute
        assert torch.equal(b.t[0::2], b.t[1::2])
        torch.testing.assert_close(eps[0::2], eps[1::2], rtol=0.0, atol=1e-3)
        assert not torch.equal(b.x0[0::2], b.x0[1::2])
        assert len(set(b.t[0::2].tolist())) == len(b.t) // 2  # one draw a pair, never shared between pairs


# -- timesteps and the reference -------------------------------------------------------------------
def test_logit_normal_and_uniform_levels() -> None:
    g = torch.Generator().manual_seed(0)
    t = pair_times(20000, "logit_normal", 0.0, 1.0, 1.0, g)
    z = torch.logit(t.double())
    # 20000 draws of N(0, 1): the mean's standard error is 0.007, the std's 0.005; 5 sigma bounds
    assert abs(float(z.mean())) < 0.035 and abs(float(z.std()) - 1.0) < 0.025
    u = pair_times(20000, "uniform", 0.0, 1.0, 1.0, torch.Generator().manual_seed(0))
    assert abs(float(u.mean()) - 0.5) < 0.011  # standard error 0.002
    shifted = pair_times(5, "uniform", 0.0, 1.0, 3.0, torch.Generator().manual_seed(1))
    raw = torch.rand(5, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(shifted, (3 * raw / (1 + 2 * raw)).clamp(1e-3, 1 - 1e-3))
    assert torch.equal(dpo().sample_times(7, torch.Generator().manual_seed(4)),
                       pair_times(7, "logit_normal", 0.0, 1.0, 1.0, torch.Generator().manual_seed(4)))


def test_reference_choices() -> None:
    assert dpo().needs_reference and dpo().lagged_decay(0) is None
    lagged = dpo(reference="lagged", ref_update_every=3)
    assert not lagged.needs_reference
    assert [lagged.lagged_decay(k) for k in range(7)] == [1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0]
    frozen = dpo(reference="lagged")
    assert all(frozen.lagged_decay(k) == 1.0 for k in range(5))
    assert dpo(reference="lagged", sampler_policy="reference").samples_from_lagged()


@pytest.mark.parametrize("settings", [{"ref_update_every": 4}, {"sampler_policy": "reference"}])
def test_lagged_settings_need_the_lagged_reference(settings: dict) -> None:
    with pytest.raises(flowrl.RecipeError, match=next(iter(settings))):
        shipped_tiny("diffusion_dpo", [f"loss.{k}={json.dumps(v)}" for k, v in settings.items()])


@pytest.mark.parametrize("options", [{}, {"pairs": "all"}, {"reference": "lagged"}, {"levels": 3},
                                     {"timesteps": "uniform", "time_shift": 3.0, "beta": 5000.0}])
def test_conformance_with_each_option(options: dict) -> None:
    check_loss(dpo(**options))


class WrongSign(DiffusionDPOLoss):
    def forward_process(self, batch: ForwardProcessInputs) -> tuple[torch.Tensor, dict[str, float]]:
        return super().forward_process(attrs.evolve(batch, advantages=-batch.advantages))


def test_conformance_catches_a_reversed_preference() -> None:
    with pytest.raises(ConformanceError, match="highest advantage towards"):
        check_loss(WrongSign(DiffusionDPOLoss.Config()))


# -- the preference file ---------------------------------------------------------------------------
@pytest.mark.parametrize("edit", [False, True])
def test_shipped_pairs_are_the_generator_output(tmp_path: Path, edit: bool) -> None:
    path = (write_world_edit_pairs if edit else write_world_pairs)(tmp_path / "pairs")
    shipped = ROOT / "recipes" / "data" / ("dpo_world_edit" if edit else "dpo_world")
    assert path.read_text() == (shipped / "pairs.jsonl").read_text()
    made = sorted((tmp_path / "pairs" / "img").iterdir())
    assert [p.name for p in made] == sorted(p.name for p in (shipped / "img").iterdir())
    for image in made:
        assert image.read_bytes() == (shipped / "img" / image.name).read_bytes()
    assert sum(p.stat().st_size for p in shipped.rglob("*") if p.is_file()) < 100_000
    pairs = read_preferences(str(path))
    assert len(pairs) == 16 and pairs[0].chosen.size == (32, 32)
    conditions = [flowrl.core.conditions.conditions_of(p.prompt) for p in pairs]
    assert all(len(c) == (1 if edit else 0) for c in conditions)
    if edit:  # the condition is the source, which is the rejected image: the edit not done
        assert all(c[0] == p.rejected and c[0] != p.chosen for c, p in zip(conditions, pairs, strict=True))


def write_file(folder: Path, lines: list[object]) -> Path:
    path = folder / "prefs.jsonl"
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


def bad_cases(folder: Path) -> list[tuple[list[object], str]]:
    img = folder / "img"
    img.mkdir()
    Image.new("RGB", (32, 32), (200, 0, 0)).save(img / "a.png")
    Image.new("RGB", (32, 32), (0, 0, 200)).save(img / "b.png")
    Image.new("RGB", (16, 16), (0, 0, 200)).save(img / "small.png")
    Image.new("L", (32, 32), 7).save(img / "grey.png")
    (img / "broken.png").write_bytes(b"not a png")
    ok = {"prompt": "a red circle", "chosen": "img/a.png", "rejected": "img/b.png"}
    return [
        ([ok, "{not json"], r"line 2: not JSON"),
        ([{"chosen": "img/a.png", "rejected": "img/b.png"}], r'line 1: "prompt" must be a non-empty string'),
        ([{"prompt": "x", "chosen": "img/a.png"}], r'line 1: "rejected" must be an image path'),
        ([{**ok, "chosen": "img/missing.png"}], r'line 1: "chosen" image img/missing.png: no such file'),
        ([{**ok, "rejected": "img/broken.png"}], r'line 1: "rejected" image img/broken.png: not an image'),
        ([ok, {**ok, "rejected": "img/small.png"}], r'line 2: "rejected" image img/small.png is 16x16, the file\'s'),
        ([{**ok, "chosen": "img/grey.png"}], r'line 1: "chosen" image img/grey.png is L; save it as RGB'),
        ([{**ok, "image": "img/missing.png"}], r"line 1: condition image img/missing.png: no such file"),
        (["", "  "], r"no records"),
    ]


def test_preference_file_errors_name_the_file_line_and_key(tmp_path: Path) -> None:
    for case, (lines, message) in enumerate(bad_cases(tmp_path)):
        path = write_file(tmp_path, lines)
        with pytest.raises(PreferenceFileError, match=message) as info:
            read_preferences(str(path), "sampler.path")
        text = str(info.value)
        assert text.startswith(f"[sampler.path] preference file {path}") and "\n" not in text, (case, text)
    with pytest.raises(PreferenceFileError, match="no such file"):
        read_preferences(str(tmp_path / "none.jsonl"))


def test_conditions_ride_with_the_prompt(tmp_path: Path) -> None:
    bad_cases(tmp_path)
    path = write_file(tmp_path, [{"prompt": "make it blue", "chosen": "img/a.png", "rejected": "img/b.png",
                                  "image": "img/a.png"}])
    (pair,) = read_preferences(str(path))
    assert str(pair.prompt) == "make it blue" and len(flowrl.core.conditions.conditions_of(pair.prompt)) == 1


def test_a_bad_preference_file_stops_train_with_one_line_and_status_2(tmp_path: Path) -> None:
    bad_cases(tmp_path)
    path = write_file(tmp_path, [{"prompt": "a red circle", "chosen": "img/a.png", "rejected": "img/missing.png"}])
    run = subprocess.run(
        [sys.executable, "-m", "flowrl.cli.main", "train", str(ROOT / "recipes" / "diffusion_dpo_offline.toml"),
         "--set", f"sampler.path={path}", "--output-dir", str(tmp_path / "run")],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )
    assert run.returncode == 2, run.stderr[-2000:]
    last = run.stderr.strip().splitlines()[-1]
    assert "[sampler.path] preference file" in last and "line 1" in last and '"rejected" image' in last, last


# -- whole runs ------------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides", [
    [],
    ["loss.pairs=\"all\"", "loss.levels=2"],
    ["loss.reference=\"lagged\"", "loss.sampler_policy=\"reference\"", "loss.ref_update_every=1"],
])
def test_online_recipe_runs_on_the_tiny_model(tmp_path: Path, overrides: list[str]) -> None:
    recipe = shipped_tiny("diffusion_dpo", ["sampler.group_size=4", *overrides])
    Trainer(recipe, tmp_path / "run", quiet=True).run()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(math.isfinite(r["loss"]) for r in rows)
    assert rows[0]["grad_norm"] > 0 and "dpo/accuracy" in rows[0]


def test_online_recipe_on_the_world(tmp_path: Path) -> None:
    recipe = load_recipe(ROOT / "recipes" / "diffusion_dpo.toml", [
        "trainer.max_steps=2", "trainer.eval_every=0", "trainer.checkpoint_every=0", "trainer.image_every=0",
        "trainer.prompts_per_step=2", "sampler.group_size=4"])
    trainer = Trainer(recipe, tmp_path / "run", quiet=True)
    initial = {n: p.detach().clone() for n, p in trainer.named_params}
    trainer.run()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # the first update starts at policy = reference: the loss is log 2 (float32)
    assert math.isclose(rows[0]["policy_loss"], math.log(2.0), rel_tol=1e-5)
    assert any(not torch.equal(p.detach(), initial[n]) for n, p in trainer.named_params)


def test_offline_recipe_runs_without_rollouts(tmp_path: Path) -> None:
    path = write_world_pairs(tmp_path / "pairs", pairs=4)
    recipe = load_recipe(ROOT / "recipes" / "diffusion_dpo_offline.toml", [
        f"sampler.path={json.dumps(str(path))}", "trainer.max_steps=3", "trainer.eval_every=0",
        "trainer.checkpoint_every=0", "trainer.image_every=0", "trainer.prompts_per_step=2"])
    trainer = Trainer(recipe, tmp_path / "run", quiet=True)
    trainer.run()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and rows[-1]["nfe"] == 0  # no image generated
    assert math.isclose(rows[0]["policy_loss"], math.log(2.0), rel_tol=1e-5)
    assert all(r["advantage/abs_mean"] == 1.0 for r in rows)  # the labels, +1 and -1
    # the verifier logs the file's images: the preferred rendering scores 1, the other scene about 0
    assert 0.4 <= rows[0]["reward/world_verifier"] <= 0.6
