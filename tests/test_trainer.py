"""The shared loop end to end on the tiny model: run folder, metrics, TensorBoard, checkpoints, resume."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import attrs
import pytest
import torch
from conftest import tiny_recipe
from safetensors.torch import load_file

from flowrl import Plan, PlanError, Schedule, TimestepSelector, Unit
from flowrl.config.recipe import RecipeError, recipe_from_dict
from flowrl.export.loading import load_policy
from flowrl.trainer import Trainer, train
from flowrl.trainer.run_errors import BestMetricError

KEYS = {
    *("step", "wall_s", "nfe", "reward/jpeg_compressibility", "loss", "clip_frac", "grad_norm"),
    *("health/diversity", "health/zero_spread"),
}


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_run_folder(tmp_path: Path) -> None:
    run = train(recipe_from_dict(tiny_recipe(image_every=1)), tmp_path / "run", quiet=True)
    rows = metrics(run)
    assert [r["step"] for r in rows] == [1, 2]
    assert set(rows[0]) >= KEYS
    # 2 prompts x G=4 rollouts x 4 steps, one evaluation per rollout per step.
    assert [r["nfe"] for r in rows] == [32, 64]
    # 3 trained units x 8 rollouts = 24 trained inputs. The default update (auto: retain here) backpropagates
    # through the rollout's own forwards, so each counts once (its backward); recompute counts each twice.
    assert [r["rows"] for r in rows] == [32 + 24, 2 * (32 + 24)]
    assert all(r["update/backward_rows"] == 24 and r["update/recomputed_rows"] == 0 for r in rows)
    recomputed = train(recipe_from_dict(tiny_recipe(update="recompute")), tmp_path / "recompute", quiet=True)
    assert [r["rows"] for r in metrics(recomputed)] == [32 + 2 * 24, 2 * (32 + 2 * 24)]
    assert (run / "recipe.toml").exists()
    assert list((run / "tb").glob("events.out.tfevents.*"))
    ckpt = run / "checkpoints" / "step_000002"
    assert (ckpt / "weights.safetensors").exists() and (ckpt / "samples.png").exists()
    assert load_file(str(ckpt / "weights.safetensors"))


def test_sample_row_is_drawn_once_per_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An evaluation and a checkpoint at the same step share one sample row (the weights are the same)."""
    import flowrl.evaluation.evaluate

    drawn: list[int] = []
    real = flowrl.evaluation.evaluate.ode_images

    def counted(*args: object, **kwargs: object) -> torch.Tensor:
        if sys._getframe(1).f_code.co_name == "grid":  # the sample row, not the evaluation's own images
            drawn.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(flowrl.evaluation.evaluate, "ode_images", counted)
    recipe = recipe_from_dict(tiny_recipe(image_every=1, eval_every=1, eval_prompts=1, checkpoint_every=1))
    run = train(recipe, tmp_path / "run", quiet=True)
    # steps 0, 1, 2 evaluated; steps 1 and 2 checkpointed (2 twice: the loop's and the final save)
    assert len(drawn) == 3
    assert {p.name for p in (run / "samples").glob("*.png")} == {f"step_{k:06d}.png" for k in range(3)}
    assert (run / "checkpoints" / "step_000001" / "samples.png").is_file()


def test_first_update_is_on_policy(tmp_path: Path) -> None:
    """Recomputed log-densities equal the rollout's: ratio 1 (to float rounding), nothing clipped."""
    run = train(recipe_from_dict(tiny_recipe(max_steps=1)), tmp_path / "run", quiet=True)
    row = metrics(run)[0]
    assert abs(row["ratio_mean"] - 1.0) < 1e-6
    assert row["clip_frac"] == 0.0


def test_training_changes_weights_and_checkpoint_reloads(tmp_path: Path) -> None:
    recipe = recipe_from_dict(tiny_recipe())
    trainer = Trainer(recipe, tmp_path / "run", quiet=True)
    before = {n: p.detach().clone() for n, p in trainer.named_params}
    trainer.run()
    after = dict(trainer.named_params)
    assert any(not torch.equal(before[n], after[n]) for n in before)
    loaded = load_policy(tmp_path / "run")
    for name, param in loaded.backbone.transformer.named_parameters():
        assert torch.equal(param, after[name].detach())
    assert loaded.step == 2


def test_resume_continues_the_same_run(tmp_path: Path) -> None:
    full = train(recipe_from_dict(tiny_recipe(max_steps=3)), tmp_path / "full", quiet=True)
    part = train(recipe_from_dict(tiny_recipe(max_steps=2)), tmp_path / "part", quiet=True)
    resumed = train(recipe_from_dict(tiny_recipe(max_steps=3)), part, resume=part, quiet=True)
    a, b = metrics(full), metrics(resumed)
    assert [r["step"] for r in b] == [1, 2, 3]
    assert [r["reward/total"] for r in a] == [r["reward/total"] for r in b]
    assert [r["rows"] for r in a] == [r["rows"] for r in b]  # the rows counter is checkpointed
    wa = load_file(str(full / "checkpoints" / "step_000003" / "weights.safetensors"))
    wb = load_file(str(resumed / "checkpoints" / "step_000003" / "weights.safetensors"))
    # exact: a resumed run replays the same batches, draws and optimiser state through the same arithmetic
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_resume_applies_trainer_changes_and_records_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    part = train(recipe_from_dict(tiny_recipe(max_steps=2)), tmp_path / "run", quiet=True)
    before = (part / "recipe.toml").read_text()
    changed = tiny_recipe(max_steps=3)
    changed["optim"]["lr"] = 2e-4
    train(recipe_from_dict(changed), part, resume=part, quiet=True)
    assert [r["step"] for r in metrics(part)] == [1, 2, 3] and metrics(part)[-1]["lr"] == 2e-4
    assert (part / "recipe.step_000002.toml").read_text() == before  # what ran up to step 2
    assert "max_steps = 3" in (part / "recipe.toml").read_text()  # what runs from there
    err = capsys.readouterr().err
    assert "resumed at step 2 with changed settings: optim.lr 0.0001 -> 0.0002, trainer.max_steps 2 -> 3" in err


def test_resume_refuses_a_changed_method_before_anything_changes(tmp_path: Path) -> None:
    part = train(recipe_from_dict(tiny_recipe(max_steps=2)), tmp_path / "run", quiet=True)
    files = {p: p.read_bytes() for p in part.rglob("*") if p.is_file()}
    changed = tiny_recipe(max_steps=3)
    changed["sampler"]["group_size"] = 8
    with pytest.raises(RecipeError, match=r"\[sampler.group_size\] is 8 but the run being resumed used 4"):
        Trainer(recipe_from_dict(changed), part, resume=part, quiet=True)
    assert {p: p.read_bytes() for p in part.rglob("*") if p.is_file()} == files


@pytest.mark.parametrize(
    "extra",
    [
        {"lora": {"rank": 4, "alpha": 8.0}, "loss": {"type": "ppo_clip", "kl_beta": 0.01}},
        {"loss": {"type": "ppo_clip", "kl_beta": 0.01}},
        {"trainer": {"ema_decay": 0.9}},
    ],
    ids=["lora+kl", "full+kl", "ema"],
)
def test_options_run(tmp_path: Path, extra: dict) -> None:
    data = tiny_recipe()
    for key, value in extra.items():
        data[key] = {**data.get(key, {}), **value}
    trainer = Trainer(recipe_from_dict(data), tmp_path / "run", quiet=True)
    if "lora" in extra:
        assert all("lora" in n for n, _ in trainer.named_params)
    trainer.run()
    rows = metrics(tmp_path / "run")
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)
    if "kl_beta" in extra.get("loss", {}):
        assert "kl" in rows[-1]


def test_time_limit_stops_the_run_with_a_final_evaluation(tmp_path: Path) -> None:
    """``trainer.max_minutes``: the iteration that ends past the limit is the last, and it is evaluated."""
    recipe = recipe_from_dict(tiny_recipe(max_steps=1000, max_minutes=1e-9, eval_every=100))
    rows = metrics(train(recipe, tmp_path / "run", quiet=True))
    assert [r["step"] for r in rows] == [0, 1]  # the initial evaluation, then one iteration
    assert "eval/score" in rows[-1]


def test_evaluation_every_nfe(tmp_path: Path) -> None:
    """``trainer.eval_every_nfe``: evaluated after the iterations whose rollouts cross a multiple, and the last."""
    recipe = recipe_from_dict(tiny_recipe(max_steps=5, eval_every_nfe=48, eval_prompts=2))
    rows = metrics(train(recipe, tmp_path / "run", quiet=True))
    # 32 NFE per iteration: 0 -> 32 -> 64 -> 96 -> 128 -> 160 crosses 48 at step 2, 96 at 3, 144 at 5.
    assert [r["step"] for r in rows if "eval/score" in r] == [0, 2, 3, 5]


class StraySelector(TimestepSelector):
    """A buggy selector: its second unit starts past the 4-step schedule."""

    @attrs.frozen
    class Config:
        pass

    def plan(self, schedule: Schedule, iteration: int, generator: torch.Generator) -> Plan:
        return Plan(units=(Unit(0), Unit(schedule.num_steps + 2)), trained=(0, 1))


@pytest.mark.parametrize(
    ("units", "problem"),
    [
        ((Unit(-20),), "outside the schedule"),
        ((Unit(3, merge=2),), "outside the schedule"),
        ((Unit(0, merge=0),), "outside the schedule"),
        ((Unit(0, merge=2), Unit(1)), "overlap"),
    ],
)
def test_plan_check_refuses_units_outside_the_schedule(units: tuple[Unit, ...], problem: str) -> None:
    Plan(units=(Unit(0), Unit(1, merge=3)), trained=(0, 1)).check(4)  # fits exactly: no error
    with pytest.raises(PlanError, match=problem):
        Plan(units=units, trained=()).check(4)


def test_a_stray_unit_stops_the_run_naming_the_selector(tmp_path: Path) -> None:
    data = tiny_recipe(max_steps=1)
    data["selector"] = {"type": "test_trainer:StraySelector"}
    with pytest.raises(PlanError, match=r"selector 'test_trainer:StraySelector' at iteration 0: unit .*start=6"):
        train(recipe_from_dict(data), tmp_path / "run", quiet=True)


def test_best_checkpoint_holds_the_best_evaluation(tmp_path: Path) -> None:
    data = tiny_recipe(max_steps=4, eval_every=1, eval_prompts=2, checkpoint_every=1, keep_checkpoints=10)
    data["optim"]["lr"] = 3e-3  # large steps, so the evaluations differ
    run = train(recipe_from_dict(data), tmp_path / "run", quiet=True)
    scores = {r["step"]: r["eval/score"] for r in metrics(run) if "eval/score" in r}
    assert set(scores) == {0, 1, 2, 3, 4}
    later = {s: v for s, v in scores.items() if s > 0}
    best_step = max(later, key=lambda s: later[s])
    best = run / "checkpoints" / "best"
    if later[best_step] <= scores[0]:  # no evaluation beat the initial policy: best holds the initial weights
        best_step = 0
    state = json.loads((best / "trainer_state.json").read_text())
    assert state["step"] == best_step and state["best"] == {"figure": "eval/score", "value": scores[best_step]}
    kept = load_file(str(best / "weights.safetensors"))
    if best_step:
        same = load_file(str(run / "checkpoints" / f"step_{best_step:06d}" / "weights.safetensors"))
        assert all(torch.equal(kept[n], same[n]) for n in same)  # the weights of that step, bit for bit
    assert load_policy(run, checkpoint="best").step == best_step
    assert load_policy(run, checkpoint="2").step == 2 and load_policy(run).step == 4


def test_best_checkpoint_exists_when_nothing_beat_the_start(tmp_path: Path) -> None:
    """lr 0 leaves the weights as they were: no evaluation beats step 0's, and checkpoints/best holds the initial
    weights, as the summary says."""
    from flowrl.trainer.summary import run_summary

    data = tiny_recipe(max_steps=2, eval_every=1, eval_prompts=2)
    data["optim"]["lr"] = 1e-12
    run = train(recipe_from_dict(data), tmp_path / "run", quiet=True)
    state = json.loads((run / "checkpoints" / "best" / "trainer_state.json").read_text())
    scores = [r["eval/score"] for r in metrics(run) if "eval/score" in r]
    assert state["step"] == 0 and state["best"]["value"] == max(scores) == scores[0]
    assert load_policy(run, checkpoint="best").step == 0
    assert "best: eval/score" in run_summary(run) and "at step 0 (the initial weights" in run_summary(run)


def test_keep_best_must_name_an_evaluation_figure(tmp_path: Path) -> None:
    data = tiny_recipe(max_steps=1, eval_every=1, eval_prompts=2, keep_best="eval/strict")
    with pytest.raises(BestMetricError, match=r"keep_best = 'eval/strict' is not an evaluation figure .*eval/score"):
        train(recipe_from_dict(data), tmp_path / "run", quiet=True)
