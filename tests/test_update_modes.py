"""The recompute-free update (trainer.update = "retain"): the same gradient as the recompute path, with no
transformer forward of its own, for every shipped embedded recipe where it applies; refused where it is not
exact."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flowrl.config.recipe import RecipeError, load_recipe
from flowrl.config.update_modes import resolve_update

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["trainer.prompts_per_step=2", "trainer.eval_every=0", "trainer.eval_every_nfe=0", "trainer.kl_every=0",
         "trainer.max_minutes=0", "trainer.checkpoint_every=0", "trainer.image_every=0"]
SHIPPED = sorted(p.stem for p in (ROOT / "recipes").glob("*.toml"))
RETAINED = [name for name in SHIPPED if resolve_update(load_recipe(ROOT / "recipes" / f"{name}.toml")) == "retain"]
# a recipe whose reward is served over HTTP needs its server to train; its update is its in-process twin's
# (flow_grpo_remote: flow_grpo's, checked here), and tests/test_serve.py trains it against a real server
SERVED = {
    name for name in SHIPPED if any(r.type == "remote" for r in load_recipe(ROOT / "recipes" / f"{name}.toml").rewards)
}


def test_auto_picks_retain_where_exact() -> None:
    """Every shipped embedded recipe resolves to retain but the forward-process ones and those with two inner
    epochs (the trust-region methods, whose second step differentiates moved weights)."""
    assert set(SHIPPED) - set(RETAINED) == {
        "diffusion_nft", "aegpo_nft", "crd", "grpo_guard", "flow_dppo", "diffusion_dpo", "diffusion_dpo_offline"
    }


@pytest.mark.parametrize("name", [name for name in RETAINED if name not in SERVED])
def test_retain_gives_the_recompute_gradient(name: str, tmp_path: Path) -> None:
    from flowrl.trainer.loop import Trainer

    recipe = load_recipe(ROOT / "recipes" / f"{name}.toml", [*SMALL, "trainer.update=retain"])
    trainer = Trainer(recipe, tmp_path / "run", quiet=True)
    updater, backbone = trainer.updater, trainer.backbone
    seen: dict[str, object] = {}

    def both(rollout, advantages, rewards):  # type: ignore[no-untyped-def]
        grads: list[list[torch.Tensor]] = []
        trainer.policy.step = lambda: grads.append(  # type: ignore[method-assign]
            [p.grad.detach().clone() for _, p in trainer.named_params]
        )
        retained = trainer.retention.take()
        assert retained is not None and retained.rows_kept > 0, "the rollout kept no graph"
        forwards = []
        for kept in (None, retained):  # recompute first: it must not consume the kept graphs
            nfe0 = backbone.nfe
            seen[f"result_{kept is None}"] = updater(rollout, advantages, rewards, trainer.step, kept)
            forwards.append(backbone.nfe - nfe0)
        seen.update(grads=grads, forwards=forwards, inputs=rollout.transitions.num_inputs)
        del trainer.policy.step
        return seen["result_False"]

    trainer.update = both  # type: ignore[method-assign]
    try:
        trainer.iteration()
    finally:
        trainer.release()
    recompute, retain = seen["forwards"]  # type: ignore[misc]
    assert recompute - retain == seen["inputs"], "the retained update ran the transformer on trained inputs"
    result = seen["result_False"]
    # every trained input found among the kept rows (equal inputs, e.g. DanceGRPO's shared first noise, share one)
    assert result["update/recomputed_rows"] == 0 and 0 < result["update/retained_used"] <= seen["inputs"]  # type: ignore[index]
    a, b = (torch.cat([g.flatten() for g in grads]) for grads in seen["grads"])  # type: ignore[attr-defined]
    assert float(a.norm()) > 0
    # float32: the velocities come from the rollout's batches instead of the update's micro-batches (different
    # BLAS blocking, ~1e-7 relative per value); the gradient norm-relative difference stays far below 1e-5
    assert float((a - b).norm() / a.norm()) < 1e-5


@pytest.mark.parametrize(
    ("name", "override", "key"),
    [
        ("diffusion_nft", [], "loss"),
        ("flow_grpo", ["trainer.inner_epochs=2"], "trainer.inner_epochs"),
        ("flow_grpo", ["trainer.sharding=fsdp"], "trainer.sharding"),
        ("flow_grpo", ["lora.dropout=0.1"], "lora.dropout"),
    ],
)
def test_retain_refused_where_not_exact(name: str, override: list[str], key: str) -> None:
    path = ROOT / "recipes" / f"{name}.toml"
    assert resolve_update(load_recipe(path, override)) == "recompute"  # auto falls back
    with pytest.raises(RecipeError) as error:
        load_recipe(path, [*override, "trainer.update=retain"])
    message = error.value.report()
    assert "trainer.update" in message and key in message


def test_retained_graphs_that_would_not_fit(tmp_path: Path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """The kept graphs are counted while the rollout makes them: past 90% of the free memory an explicit
    'retain' stops with a one-line error naming trainer.update (exit 2), before the device would run out;
    'auto' drops them, says so once and recomputes."""
    import flowrl.trainer.retain as retain
    from flowrl.cli.main import main

    recipe = tmp_path / "r.toml"
    overrides = [*SMALL, "trainer.max_steps=1", "trainer.update=retain"]
    recipe.write_text(load_recipe(ROOT / "recipes" / "flow_grpo.toml", overrides).to_toml())
    monkeypatch.setattr(retain, "available_bytes", lambda device: 2**20)  # 1 MiB free
    assert main(["train", str(recipe), "--output-dir", str(tmp_path / "run"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "trainer.update" in err and "retained graphs passed" in err and "Traceback" not in err
    monkeypatch.setattr(retain, "available_bytes", lambda device: None)  # unknown: no check, the run trains
    assert main(["train", str(recipe), "--output-dir", str(tmp_path / "run2"), "--quiet"]) == 0
    capsys.readouterr()
    # auto: the graphs are dropped, the update recomputes (said once), the run trains
    monkeypatch.setattr(retain, "available_bytes", lambda device: 2**20)
    auto = tmp_path / "auto.toml"
    auto.write_text(load_recipe(recipe, ["trainer.max_steps=2", "trainer.update=auto"]).to_toml())
    assert main(["train", str(auto), "--output-dir", str(tmp_path / "run3"), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert err.count("trainer.update = auto: the rollout's retained graphs passed") == 1
    assert "recomputes from now on" in err
    rows = (tmp_path / "run3" / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 2 and all("update/retained_used" not in row for row in rows)


def test_budget_checkpoints_what_does_not_fit_whole_and_stays_exact(tmp_path: Path) -> None:
    """Past the whole graphs' bound the rollout's calls run with their blocks checkpointed: they keep less, the
    update still runs no forward of its own on a trained input, and the gradient is the recompute path's."""
    from flowrl.trainer.loop import Trainer

    recipe = load_recipe(ROOT / "recipes" / "flow_grpo.toml", [*SMALL, "trainer.update=retain"])
    trainer = Trainer(recipe, tmp_path / "run", quiet=True)
    trainer.retention.limits = lambda: (None, 1)  # type: ignore[method-assign]  # the first call whole, then checkpoints
    updater, backbone, seen = trainer.updater, trainer.backbone, {}

    def both(rollout, advantages, rewards):  # type: ignore[no-untyped-def]
        grads: list[list[torch.Tensor]] = []
        trainer.policy.step = lambda: grads.append(  # type: ignore[method-assign]
            [p.grad.detach().clone() for _, p in trainer.named_params]
        )
        retained = trainer.retention.take()
        assert retained is not None
        seen.update(kept=retained.rows_kept, per_row=retained.per_row, mb=retained.bytes_kept / 2**20,
                    inputs=rollout.transitions.num_inputs)
        nfe0 = backbone.nfe
        seen["result"] = updater(rollout, advantages, rewards, trainer.step, retained)
        seen["forwards"] = backbone.nfe - nfe0
        updater(rollout, advantages, rewards, trainer.step, None)
        seen["grads"] = grads
        del trainer.policy.step
        return seen["result"]

    trainer.update = both  # type: ignore[method-assign]
    try:
        trainer.iteration()
    finally:
        trainer.release()
    result = seen["result"]
    checkpointed = result["update/checkpointed_rows"]  # type: ignore[index]
    assert 0 < checkpointed < seen["kept"], "the budget should keep the first call whole and checkpoint the rest"
    # a checkpointed row keeps its blocks' inputs only: far less than a whole row's activations
    assert seen["mb"] * 2**20 < seen["per_row"] * seen["kept"] / 2  # type: ignore[operator]
    assert seen["forwards"] == 0 and result["update/recomputed_rows"] == 0  # type: ignore[index]
    retain_grad, recompute_grad = (torch.cat([g.flatten() for g in gs]) for gs in seen["grads"])  # type: ignore[attr-defined]
    # the checkpointed backward runs each block's forward again on the same input: the same values as the rollout's
    # forward up to BLAS blocking (~1e-7 relative), as the whole-graph comparison above
    assert float((retain_grad - recompute_grad).norm() / recompute_grad.norm()) < 1e-5


def test_budget_bounds(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Without a budget: 90% of the free memory, less a reserve for the update for whole graphs. With one: the
    budget less what the process held when it first rolled out (off CUDA) and less what an iteration needed
    beside its kept graphs (measured from the last iteration's peak); the first rollout keeps one call whole and
    checkpoints the rest; a share is of the device's total memory; a bad value is a recipe error."""
    import flowrl.trainer.retain as retain
    from flowrl.trainer.retain import Retention

    class Backbone:
        device = torch.device("cpu")
        transformer = torch.nn.Linear(10, 10)  # 110 float32 parameters: 440 bytes

    class Kept:  # what a rollout kept, as RetainedVelocities reports it
        per_row, largest_call, abandoned, bytes_kept, bytes_whole = 10.0, 50, "", 3000, 2000

    def retention_for(budget: str) -> Retention:
        r = Retention.__new__(Retention)
        overrides = [f"trainer.memory_budget={budget}"] if budget else []
        r.recipe = load_recipe(ROOT / "recipes" / "flow_grpo.toml", overrides)
        r.backbone, r.kept, r.recordings, r.per_row, r.largest_call = Backbone(), None, 0, 0.0, 0
        r.base_used, r.beside, r.last_start, r.last, r.last_checkpointed = None, 0, 0, None, 0
        return r

    monkeypatch.setattr(retain, "available_bytes", lambda device: 10**9)
    monkeypatch.setattr(retain, "used_bytes", lambda device: 4000)
    plain = retention_for("")
    assert plain.limits() == (9 * 10**8, 9 * 10**8 - 3 * 440)
    plain.recordings, plain.kept = 1, Kept()
    plain.take()
    assert plain.limits() == (9 * 10**8, 9 * 10**8 - 440 - 500)  # the moments exist now; one call of 50 rows

    budget = retention_for("20000")
    margin = 20000 // 20  # off CUDA, for what the C allocator keeps
    assert budget.limits() == (16000 - margin, 0)  # first rollout: one whole call, then checkpoints
    budget.recordings, budget.kept = 1, Kept()
    budget.take()
    monkeypatch.setattr(retain, "used_bytes", lambda device: 9000)  # a CPU's resident set keeps freed graphs:
    monkeypatch.setattr(retain, "peak_bytes", lambda device: 11000)  # the first figure stays what it held
    beside = 11000 - 4000 - 3000
    assert budget.limits() == (16000 - beside - margin, 16000 - beside - margin - 1000)
    monkeypatch.setattr(retain, "available_bytes", lambda device: 5000)  # 90% of the free memory is tighter
    assert budget.limits()[0] == 4500

    monkeypatch.setattr(retain, "total_bytes", lambda device: 20000)
    assert retention_for("0.5").budget_bytes() == 10000
    with pytest.raises(RecipeError) as error:
        load_recipe(ROOT / "recipes" / "flow_grpo.toml", ["trainer.memory_budget=lots"])
    assert "trainer.memory_budget" in error.value.report()
