"""The summary `flowrl train` prints at the end of a run, from the run folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from conftest import ROOT, tiny_recipe
from test_cli import flowrl_cli

from flowrl.config.recipe import recipe_from_dict
from flowrl.trainer import train
from flowrl.trainer.summary import run_summary


def test_cli_train_prints_the_summary(tmp_path: Path) -> None:
    """A world run with evaluations: first and last figure with standard errors, the best checkpoint, next commands."""
    out = flowrl_cli(
        "train", str(ROOT / "recipes" / "flow_grpo.toml"), "--output-dir", str(tmp_path / "run"), "--quiet",
        *("--set", "trainer.max_steps=2", "--set", "trainer.eval_every=1", "--set", "trainer.eval_prompts=8"),
        *("--set", "trainer.max_minutes=0", "--set", "trainer.prompts_per_step=1", "--set", "trainer.image_every=0"),
    )
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    first, last = rows[0], rows[-1]
    text = out.stdout
    assert f"run folder: {tmp_path / 'run'}" in text
    assert "trained: 2 iterations" in text
    want = (f"eval/strict: {first['eval/strict']:.3f} ± {first['eval/strict_se']:.3f} at step 0 -> "
            f"{last['eval/strict']:.3f} ± {last['eval/strict_se']:.3f} at step 2")
    assert want in text
    assert "flowrl report " in text and "alerts: " in text
    best = tmp_path / "run" / "checkpoints" / "best"
    if best.is_dir():
        assert f"weights in {best}" in text and "--checkpoint best" in text
    else:
        assert "no evaluation beat step 0's" in text and "--checkpoint best" not in text


def test_summary_without_evaluation_says_so(tmp_path: Path) -> None:
    run = train(recipe_from_dict(tiny_recipe(eval_every=0)), tmp_path / "run", quiet=True)
    text = run_summary(run)
    assert "evaluation: none ran" in text and "--checkpoint best" not in text
    assert "training reward: " in text and "alerts: none fired" in text


def test_summary_of_a_reward_without_an_evaluation_figure(tmp_path: Path) -> None:
    """JPEG compressibility reports figures, but neither eval/strict nor eval/score: the summary says which it has."""
    run = train(recipe_from_dict(tiny_recipe(eval_every=1, eval_prompts=1, keep_best="")), tmp_path / "run", quiet=True)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    figures = sorted(k for k in rows[-1] if k.startswith("eval/"))
    text = run_summary(run, "")
    if "eval/score" in figures or "eval/strict" in figures:
        assert "eval/" in text and "-> " in text
    else:
        assert f"no eval/strict or eval/score figure ({', '.join(figures)})" in text


def test_summary_lists_alerts_and_a_missing_best(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    rows = [
        {"step": 0, "nfe": 0, "wall_s": 0.0, "eval/score": 0.5, "eval/score_se": 0.01},
        {"step": 1, "nfe": 10, "wall_s": 1.0, "loss": 0.0, "reward/total": 0.2, "alert/diversity": 1},
        {"step": 2, "nfe": 20, "wall_s": 2.0, "loss": 0.0, "reward/total": 0.3, "alert/diversity": 1,
         "eval/score": 0.4, "eval/score_se": 0.02, "skipped_steps": 1},
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = run_summary(run)
    assert "eval/score: 0.500 ± 0.010 at step 0 -> 0.400 ± 0.020 at step 2 (-0.100" in text
    assert "best: no evaluation beat step 0's 0.500" in text
    assert "alert/diversity at 2 step(s), 1..2" in text
    assert "skipped: 1 iterations" in text
    assert "training reward: 0.200 at step 1 -> 0.300 at step 2" in text
    shutil.rmtree(run)
    run.mkdir()
    assert "no iteration was logged" in run_summary(run)


def test_summary_says_which_update_ran_and_why(tmp_path: Path) -> None:
    """retain with its largest graphs, a fall-back to recompute under auto, and auto's reason for recompute."""
    run = tmp_path / "run"
    run.mkdir()
    auto = recipe_from_dict(tiny_recipe())
    kept = [{"step": k, "nfe": 10 * k, "wall_s": k, "loss": 0.0, "update/retained_mb": mb}
            for k, mb in ((1, 3.25), (2, 4.5))]
    plain = {"step": 3, "nfe": 30, "wall_s": 3.0, "loss": 0.0}
    for rows, want in (
        (kept, "update: retain (trainer.update = auto: exact for this recipe); the rollouts kept graphs of at most"
               " 4.5 MB an iteration"),
        ([*kept, plain], "update: retain until step 2, then recompute (trainer.update = auto: the retained graphs"
                         " outgrew the memory free on the device)"),
    ):
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        assert want in run_summary(run, "", auto).splitlines()
    budgeted = [{**r, "update/retained_rows": 40, "update/checkpointed_rows": c}
                for r, c in zip(kept, (0, 15), strict=True)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in budgeted))
    within = recipe_from_dict(tiny_recipe(memory_budget="2GiB"))
    assert ("update: retain (trainer.update = auto: exact for this recipe); the rollouts kept graphs of at most 4.5 MB"
            " an iteration, 15 of their 80 rows checkpointed (only each block's input kept) to stay within"
            " trainer.memory_budget = 2GiB") in run_summary(run, "", within).splitlines()
    (run / "metrics.jsonl").write_text(json.dumps(plain) + "\n")
    epochs = recipe_from_dict(tiny_recipe(inner_epochs=2))
    assert ("update: recompute (trainer.update = auto: retain is not exact with trainer.inner_epochs: 2 inner "
            "epochs differentiate moved weights)") in run_summary(run, "", epochs).splitlines()
    asked = recipe_from_dict(tiny_recipe(update="recompute"))
    assert "update: recompute (trainer.update = recompute)" in run_summary(run, "", asked).splitlines()
    assert not any(line.startswith("update:") for line in run_summary(run).splitlines())  # no recipe, no line
