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
