"""``flowrl bench``: the report on synthetic run folders (fast), and the real harness through the CLI (slow)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, tiny_recipe

from flowrl.bench import BenchError
from flowrl.bench.curve import interp, x_to_reach
from flowrl.bench.report import FINAL_EVAL, build_results, markdown, write_report
from flowrl.bench.run import bench_overrides, parse_seeds
from flowrl.cli.main import main as flowrl_main

PNG = b"\x89PNG\r\n\x1a\n"


def write_run(run_dir: Path, points: list[tuple[int, float]], iteration_s: float = 0.5, peak_mb: float = 100.0,
              metric: str = "eval/strict", extra_nfe: int = 0, rows_per_nfe: float = 0.0) -> Path:
    """A metrics.jsonl like the trainer's: a step-0 evaluation, then per point a plain row and an eval row.

    Wall time is ``nfe / 100`` s; ``extra_nfe`` adds a last training row without evaluation; with
    ``rows_per_nfe`` every row also has the ``rows`` counter, ``rows_per_nfe x nfe``.
    """
    run_dir.mkdir(parents=True)
    assert points[0][0] == 0
    rows = [{"step": 0, "wall_s": 0.0, "nfe": 0, metric: points[0][1], "eval/score": 0.0}]
    cost = {"time/iteration_s": iteration_s, "time/outside_share": 0.3, "mem/peak_mb": peak_mb, "loss": 0.1}
    step = 0
    prev = 0
    for nfe, score in points[1:]:
        mid = (prev + nfe) // 2
        step += 1
        rows.append({"step": step, "wall_s": mid / 100, "nfe": mid, "reward/total": 0.0, **cost})
        step += 1
        rows.append({"step": step, "wall_s": nfe / 100, "nfe": nfe, **cost, metric: score, "eval/score": score / 2})
        prev = nfe
    if extra_nfe:
        rows.append({"step": step + 1, "wall_s": (prev + extra_nfe) / 100, "nfe": prev + extra_nfe, **cost})
    if rows_per_nfe:
        rows = [{**r, "rows": rows_per_nfe * r["nfe"]} for r in rows]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir


@pytest.fixture
def runs(tmp_path: Path) -> dict[str, dict[int, Path]]:
    r = tmp_path / "runs"
    return {
        "ref": {
            0: write_run(r / "ref/seed0", [(0, 0.2), (100, 0.4), (200, 0.6)], peak_mb=100),
            1: write_run(r / "ref/seed1", [(0, 0.2), (100, 0.6), (200, 0.8)], peak_mb=200),
        },
        "fast": {  # seed 1 has no evaluation at 50: interpolated to 0.5 there
            0: write_run(r / "fast/seed0", [(0, 0.2), (50, 0.5), (100, 0.8), (200, 0.9)], iteration_s=0.25),
            1: write_run(r / "fast/seed1", [(0, 0.2), (100, 0.8), (200, 0.9)], iteration_s=0.25),
        },
        "slow": {
            0: write_run(r / "slow/seed0", [(0, 0.2), (100, 0.3), (200, 0.4)]),
            1: write_run(r / "slow/seed1", [(0, 0.2), (100, 0.3), (200, 0.4)]),
        },
    }


def test_report_known_curves(runs: dict[str, dict[int, Path]], tmp_path: Path) -> None:
    out = tmp_path / "report"
    results = write_report(runs, out, reference=None, metric=None, meta={"nfe_budget": 200})
    assert json.loads((out / "results.json").read_text()) == results
    assert results["metric"] == "eval/strict" and results["reference"] == "ref"
    assert results["target_score"] == pytest.approx(0.7)
    ref, fast, slow = (results["methods"][m] for m in ("ref", "fast", "slow"))

    assert ref["final_score"]["mean"] == pytest.approx(0.7)
    assert ref["final_score"]["std"] == pytest.approx(math.sqrt(0.02))  # sample std of 0.6, 0.8
    assert (ref["final_score"]["min"], ref["final_score"]["max"], ref["final_score"]["n"]) == (0.6, 0.8, 2)
    assert ref["final_eval"]["eval/score"]["mean"] == pytest.approx(0.35)
    assert ref["nfe_to_reach_reference"] == pytest.approx(200)
    assert ref["nfe_ratio_to_reference"] == pytest.approx(1.0)
    assert fast["curve_nfe"]["x"] == [0, 50, 100, 200]
    assert fast["curve_nfe"]["mean"] == pytest.approx([0.2, 0.5, 0.8, 0.9])
    assert fast["nfe_to_reach_reference"] == pytest.approx(50 + 50 * 0.2 / 0.3)
    assert fast["nfe_ratio_to_reference"] == pytest.approx((50 + 50 * 0.2 / 0.3) / 200)
    assert fast["wall_s_to_reach_reference"] == pytest.approx((50 + 50 * 0.2 / 0.3) / 100)
    assert fast["final_score"]["std"] == pytest.approx(0.0)
    assert slow["nfe_to_reach_reference"] is None and slow["nfe_ratio_to_reference"] is None

    assert ref["iteration_s_mean"] == pytest.approx(0.5) and fast["iteration_s_mean"] == pytest.approx(0.25)
    assert ref["outside_share_mean"] == pytest.approx(0.3)
    assert ref["peak_mem_mb"] == 200
    seed = ref["seeds"]["1"]
    assert seed["curve"]["nfe"] == [0, 100, 200] and seed["curve"]["score"] == [0.2, 0.6, 0.8]
    assert seed["curve"]["wall_s"] == [0.0, 1.0, 2.0]
    assert seed["final"]["score"] == 0.8 and seed["final"]["nfe"] == 200 and seed["steps"] == 4
    assert results["bench"] == {"nfe_budget": 200}

    md = (out / "results.md").read_text()
    main_table = md.split("\n## ")[0]
    for name in ("ref", "fast", "slow"):
        assert sum(line.startswith(f"| {name} |") for line in main_table.splitlines()) == 1
    assert "| ref | slow | +0.3000 | 0.1000 | 3.00 | 1.0 |" in md  # the pairwise table (see the test below)
    assert "not reached" in md and "budget 200 NFE" in md
    for png in ("score_vs_nfe.png", "score_vs_wall_s.png"):
        data = (out / png).read_bytes()
        assert data.startswith(PNG) and len(data) > 5000
        from PIL import Image

        with Image.open(out / png) as image:
            assert image.format == "PNG" and min(image.size) > 100


def test_pairwise_tests_and_reach_ratios(runs: dict[str, dict[int, Path]]) -> None:
    results = build_results(runs)
    assert results["methods"]["ref"]["final_score"]["se"] == pytest.approx(0.1)  # std sqrt(0.02) / sqrt(2)
    pairs = {(r["a"], r["b"]): r for r in results["pairwise"]}
    assert set(pairs) == {("ref", "fast"), ("ref", "slow"), ("fast", "slow")}
    # ref (0.6, 0.8) vs slow (0.4, 0.4): diff 0.3, se sqrt(0.02 / 2) = 0.1, t = 3, Welch df = 1 (slow has no
    # variance), and Student's t with 1 df is the Cauchy distribution: p = 1 - 2 atan(3) / pi.
    rs = pairs["ref", "slow"]
    assert (rs["diff"], rs["se"], rs["t"], rs["df"]) == pytest.approx((0.3, 0.1, 3.0, 1.0))
    assert rs["p"] == pytest.approx(1 - 2 * math.atan(3) / math.pi, rel=1e-9) and not rs["significant"]
    assert pairs["fast", "slow"]["p"] is None  # both without variance: nothing to test
    ratios = results["reach_ratios"]
    # fast reaches ref's final mean 0.7 at 50 + 50 * 0.2 / 0.3 NFE; ref itself needs 200.
    to_ref = ratios["ref"]["fast"]
    assert to_ref["ratio"] == pytest.approx((50 + 50 * 0.2 / 0.3) / 200)
    # Resampling ref's seeds moves its level between 0.6 and 0.8: fast needs 66.7 to 100 NFE, ref 200.
    assert 1 / 3 - 1e-9 <= to_ref["low"] <= to_ref["ratio"] <= to_ref["high"] <= 0.5 + 1e-9
    assert to_ref["undefined"] == 0
    never = ratios["ref"]["slow"]  # slow never reaches 0.6 or more
    assert never["ratio"] is None and never["low"] is None and never["undefined"] == 1
    assert never["why"] == "not reached" and to_ref["why"] == ""
    # Every run starts at 0.2; +0.02 is reached by ref's mean curve (0.2 -> 0.5 over 100 NFE) at 6.67 NFE,
    # by fast's (0.2 -> 0.5 over 50) at 3.33; +0.08 by slow's (0.2 -> 0.3 over 100) at 80.
    levels = results["reach_levels"]
    assert levels["start"] == pytest.approx(0.2)
    by_gain = {m: {round(r["gain"], 2): r for r in rows} for m, rows in levels["methods"].items()}
    assert by_gain["ref"][0.02]["nfe"] == pytest.approx(20 / 3)
    assert by_gain["fast"][0.02]["nfe"] == pytest.approx(10 / 3)
    assert by_gain["slow"][0.08]["nfe"] == pytest.approx(80)
    assert by_gain["slow"][0.08]["low"] == pytest.approx(80) == by_gain["slow"][0.08]["high"]  # identical seeds


def test_reach_on_every_axis(tmp_path: Path) -> None:
    """Steps, NFE and seconds grow alike in these runs, so m needs half of ref's on each; m's transformer rows
    per NFE are 4x ref's, so in rows it needs twice as many. A run without the rows counter drops that axis."""
    r = tmp_path / "runs"
    runs = {
        "ref": {k: write_run(r / f"ref/seed{k}", [(0, 0.2), (100, 0.4), (200, 0.6)], rows_per_nfe=1) for k in (0, 1)},
        "m": {k: write_run(r / f"m/seed{k}", [(0, 0.2), (100, 0.6), (200, 0.7)], rows_per_nfe=4) for k in (0, 1)},
    }
    results = build_results(runs)
    by_axis = results["reach_ratios_by_axis"]
    assert set(by_axis) == {"step", "nfe", "wall_s", "rows"}
    assert {axis: by_axis[axis]["ref"]["m"]["ratio"] for axis in by_axis} == pytest.approx(
        {"step": 0.5, "nfe": 0.5, "wall_s": 0.5, "rows": 2.0})
    assert by_axis["rows"]["ref"]["m"]["low"] == pytest.approx(2.0)  # identical seeds: a degenerate interval
    text = markdown(results)
    assert "## To reach ref's final level, on every axis" in text
    assert "| m | 0.50 [0.50, 0.50] | 0.50 [0.50, 0.50] | 0.50 [0.50, 0.50] | 2.00 [2.00, 2.00] |" in text
    runs["m"][2] = write_run(r / "m/seed2", [(0, 0.2), (100, 0.6), (200, 0.7)])  # an older run: no rows
    assert set(build_results(runs)["reach_ratios_by_axis"]) == {"step", "nfe", "wall_s"}


def test_reference_and_metric_choice(runs: dict[str, dict[int, Path]], tmp_path: Path) -> None:
    results = build_results(runs, reference="fast", metric="eval/score")
    assert results["metric"] == "eval/score"
    assert results["target_score"] == pytest.approx(0.45)
    assert results["methods"]["fast"]["nfe_ratio_to_reference"] == pytest.approx(1.0)
    with pytest.raises(BenchError, match="unknown reference 'nope'"):
        build_results(runs, reference="nope")
    with pytest.raises(BenchError, match="metric 'eval/other' was not logged"):
        build_results(runs, metric="eval/other")
    # Without eval/strict, eval/score; without either, the first eval/* key every run logged.
    other = {"m": {0: write_run(tmp_path / "other", [(0, 0.1), (10, 0.2)], metric="eval/accuracy")}}
    assert build_results(other)["metric"] == "eval/score"
    metrics = other["m"][0] / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({k: v for k, v in json.loads(line).items() if k != "eval/score"}) + "\n"
                               for line in metrics.read_text().splitlines()))
    assert build_results(other)["metric"] == "eval/accuracy"


def test_final_evaluation_extends_the_curve(tmp_path: Path) -> None:
    run = write_run(tmp_path / "r", [(0, 0.2), (100, 0.4)], extra_nfe=50)
    (run / FINAL_EVAL).write_text(json.dumps({"step": 5, "wall_s": 1.5, "nfe": 150, "eval/strict": 0.5}))
    seed = build_results({"m": {0: run}})["methods"]["m"]["seeds"]["0"]
    assert seed["curve"]["nfe"] == [0, 100, 150] and seed["final"]["score"] == 0.5
    assert seed["nfe_used"] == 150


def test_bad_run_folders(tmp_path: Path) -> None:
    with pytest.raises(BenchError, match="no metrics.jsonl"):
        build_results({"m": {0: tmp_path / "missing"}})
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "metrics.jsonl").write_text(json.dumps({"step": 1, "nfe": 4, "wall_s": 0.1}) + "\n")
    with pytest.raises(BenchError, match="no held-out evaluations"):
        build_results({"m": {0: plain}})


def test_curve_helpers() -> None:
    assert interp(5, [0, 10], [0.0, 1.0]) == pytest.approx(0.5)
    assert interp(-1, [0, 10], [0.0, 1.0]) == 0.0 and interp(11, [0, 10], [0.0, 1.0]) == 1.0
    curve = {"x": [0, 10, 20], "mean": [0.5, 0.4, 0.8]}
    assert x_to_reach(curve, 0.6) == pytest.approx(15)
    assert x_to_reach(curve, 0.5) == 0 and x_to_reach(curve, 0.9) is None


def test_options() -> None:
    assert parse_seeds("0, 1,2") == [0, 1, 2]
    for bad in ("", ",", "a", "-1", "1,1"):
        with pytest.raises(BenchError):
            parse_seeds(bad)
    items = bench_overrides(3, 500, 2, None)
    assert {"seed=3", "trainer.max_nfe=500", "trainer.eval_every=2", "trainer.checkpoint_every=0"} <= set(items)
    assert "trainer.max_minutes=0" in items  # recipes/flow_grpo.toml's 10-minute limit must not cut a bench run


def test_resume_decisions(tmp_path: Path) -> None:
    from flowrl.bench.run import can_continue, is_complete
    from flowrl.config.recipe import recipe_from_dict

    recipe = recipe_from_dict(tiny_recipe(), bench_overrides(0, 100, 2, None))
    run = tmp_path / "run"
    (run / "checkpoints" / "step_000002").mkdir(parents=True)
    (run / "metrics.jsonl").write_text("")
    (run / "recipe.toml").write_text(recipe.to_toml())
    assert can_continue(run, recipe) and not is_complete(run, recipe)
    (run / FINAL_EVAL).write_text("{}")
    assert is_complete(run, recipe)
    other = recipe_from_dict(tiny_recipe(), bench_overrides(0, 200, 2, None))  # another budget
    assert not is_complete(run, other) and not can_continue(run, other)
    # a setting that only watches the run (an alert threshold, e.g. a new default) does not retrain it
    watched = recipe_from_dict(tiny_recipe(), [*bench_overrides(0, 100, 2, None), "trainer.alert_diversity=0.3"])
    assert watched.to_toml() != recipe.to_toml() and is_complete(run, watched)
    lr = recipe_from_dict(tiny_recipe(), [*bench_overrides(0, 100, 2, None), "optim.lr=0.5"])
    assert not is_complete(run, lr) and not can_continue(run, lr)


def test_extend_decisions(tmp_path: Path) -> None:
    from flowrl.bench.run import can_extend
    from flowrl.config.recipe import recipe_from_dict
    from flowrl.config.tomlwrite import dumps

    def bench_recipe(budget: int, *more: str) -> Any:
        return recipe_from_dict(tiny_recipe(), [*bench_overrides(0, budget, 2, None), *more])

    run = tmp_path / "run"
    run.mkdir()
    (run / "recipe.toml").write_text(bench_recipe(100).to_toml())
    assert not can_extend(run, bench_recipe(200))  # no checkpoint to continue from
    (run / "checkpoints" / "step_000003").mkdir(parents=True)
    assert can_extend(run, bench_recipe(200))
    assert not can_extend(run, bench_recipe(100))  # the same run: reused or continued, not extended
    assert not can_extend(run, bench_recipe(50))  # a smaller budget: trained again
    assert not can_extend(run, bench_recipe(200, "optim.lr=2e-4"))  # anything else changed: trained again
    assert not can_extend(run, bench_recipe(200, "trainer.eval_every=3"))
    # A run folder written before the [schedule] table (num_steps under [sampler]) still extends.
    old = tiny_recipe()
    old["sampler"].update(old.pop("schedule"))
    old_run = recipe_from_dict(old, bench_overrides(0, 100, 2, None)).to_dict()
    grid = old_run.pop("schedule")
    old_run["sampler"].update({key: grid[key] for key in ("num_steps", "shift")})  # all that [schedule] had then
    (run / "recipe.toml").write_text(dumps(old_run))
    assert can_extend(run, bench_recipe(200))
    (run / "recipe.toml").write_text("not = [toml")
    assert not can_extend(run, bench_recipe(200))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seeds", ",", "--nfe-budget", "10"], "error: argument --seeds: expected comma-separated seeds"),
        (["--nfe-budget", "0"], "error: argument --nfe-budget: expected a number of at least 1, got 0"),
        (["--nfe-budget", "10", "--set", "seed=4"], "error: --set seed: the bench sets this key"),
        (["--nfe-budget", "10", "--reference", "zz"], "error: --reference: no recipe is named 'zz'"),
    ],
)
def test_cli_user_errors(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    recipe = str(ROOT / "recipes" / "flow_grpo.toml")
    assert flowrl_main(["bench", recipe, *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(message) and "\n" not in err


def test_cli_module_is_light() -> None:
    code = "import sys, flowrl.cli.bench; print(any(m in sys.modules for m in ('flowrl.bench.run', 'matplotlib')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- the real harness --------------------------------------------------------------------------
def _write_recipe(path: Path, name: str, **sampler: object) -> Path:
    from flowrl.config.tomlwrite import dumps

    recipe = tiny_recipe()
    recipe["name"] = name
    recipe["prompts"]["heldout"] = ["a dog", "a blue circle"]
    recipe["sampler"].update(sampler)
    path.write_text(dumps(recipe))
    return path


@pytest.mark.slow
def test_bench_cli_end_to_end(tmp_path: Path) -> None:
    a = _write_recipe(tmp_path / "a.toml", "alpha")
    b = _write_recipe(tmp_path / "b.toml", "beta", group_size=2)
    out = tmp_path / "bench"
    # One intra-op thread: on a small shared CPU, torch's thread pool oversubscribes and runs ~50x slower.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "flowrl.cli.main", "bench", str(a), str(b), "--seeds", "0,1",
               "--nfe-budget", "80", "--eval-every", "2", "--eval-prompts", "2", "--output-dir", str(out), "--quiet"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| alpha |" in done.stdout and "| beta |" in done.stdout

    for name in ("results.json", "results.md", "score_vs_nfe.png", "score_vs_wall_s.png"):
        assert (out / name).is_file(), name
    results = json.loads((out / "results.json").read_text())
    assert results["metric"] == "eval/score" and results["reference"] == "alpha"  # no strict accuracy: eval/score
    assert results["bench"]["nfe_budget"] == 80 and results["bench"]["seeds"] == [0, 1]
    assert set(results["methods"]) == {"alpha", "beta"}
    for name, method in results["methods"].items():
        assert set(method["seeds"]) == {"0", "1"}
        for seed, summary in method["seeds"].items():
            run_dir = out / "runs" / name / f"seed{seed}"
            assert Path(summary["run_dir"]) == run_dir and (run_dir / FINAL_EVAL).is_file()
            assert "seed = " + seed in (run_dir / "recipe.toml").read_text()
            assert summary["curve"]["nfe"][0] == 0 and summary["curve"]["step"][0] == 0
            assert summary["final"]["nfe"] >= 80 and summary["nfe_used"] == summary["final"]["nfe"]
            assert summary["final"]["nfe"] < 80 + 32  # stops within one iteration of the budget
        assert method["final_score"]["n"] == 2 and math.isfinite(method["final_score"]["mean"])
        assert method["iteration_s_mean"] > 0 and 0 <= method["outside_share_mean"] <= 1
        assert method["peak_mem_mb"] > 0
        assert method["curve_nfe"]["x"][0] == 0
    assert results["methods"]["alpha"]["nfe_to_reach_reference"] is not None  # it reaches its own final mean

    # --resume reuses every finished run with the same resolved recipe.
    again = subprocess.run([*command, "--resume"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    reused = json.loads((out / "results.json").read_text())["bench"]["reused"]
    assert sorted(reused) == ["alpha/seed0", "alpha/seed1", "beta/seed0", "beta/seed1"]


@pytest.mark.slow
def test_extended_run_equals_a_run_given_the_larger_budget(tmp_path: Path) -> None:
    from flowrl.bench.run import run_bench

    recipe = _write_recipe(tmp_path / "a.toml", "alpha")
    options = {"eval_every": 1, "eval_prompts": 1, "quiet": True}
    run_bench([recipe], [0], 64, tmp_path / "grown", **options)  # 32 NFE per iteration: 2 iterations
    grown = run_bench([recipe], [0], 128, tmp_path / "grown", resume=True, **options)
    fresh = run_bench([recipe], [0], 128, tmp_path / "fresh", **options)
    assert grown["bench"]["extended"] == ["alpha/seed0"] and not grown["bench"]["reused"]
    run = tmp_path / "grown" / "runs" / "alpha" / "seed0"
    assert (run / "recipe.step_000002.toml").is_file()  # the settings of the first two iterations are kept

    def rows(bench: Path) -> list[dict[str, Any]]:
        lines = (bench / "runs" / "alpha" / "seed0" / "metrics.jsonl").read_text().splitlines()
        # Timings differ; the drift from the initial policy is measured after a run's last iteration, so the
        # extended run has it at step 2 as well (read-only: the rows after it are unchanged).
        timing = ("wall_s", "time/", "mem/", "health/velocity_drift", "health/kl_initial")
        return [{k: v for k, v in json.loads(line).items() if not k.startswith(timing)} for line in lines]

    # Same operations in the same order on the same process: the losses, rewards and scores are equal exactly.
    assert rows(tmp_path / "grown") == rows(tmp_path / "fresh") and rows(tmp_path / "fresh")[-1]["step"] == 4
    final = json.loads((run / FINAL_EVAL).read_text())
    assert final["step"] == 4 and final["eval/score"] == fresh["methods"]["alpha"]["seeds"]["0"]["final"]["score"]


def merge(argv: list[str]) -> int:
    return flowrl_main(["bench-merge", *argv])


def test_merging_reports_compares_methods_across_them(runs: dict[str, dict[int, Path]], tmp_path: Path) -> None:
    """flowrl bench-merge: methods from two reports compared as one bench, every comparison computed anew."""

    one, two = tmp_path / "one", tmp_path / "two"
    for folder, names in ((one, ["ref"]), (two, ["fast", "slow"])):
        folder.mkdir()
        part = build_results({n: runs[n] for n in names})
        (folder / "results.json").write_text(json.dumps(part))
    assert merge([str(one), str(two), "--reference", "ref", "--out", str(tmp_path / "merged")]) == 0
    merged = json.loads((tmp_path / "merged" / "results.json").read_text())
    whole = build_results(runs)
    assert merged["reach_ratios"] == whole["reach_ratios"] and merged["pairwise"] == whole["pairwise"]
    assert "| fast |" in (tmp_path / "merged" / "results.md").read_text()
    assert merge([str(one), str(one), "--reference", "ref", "--out", str(tmp_path / "x")]) == 2  # a seed twice
    # more seeds of a method in another report join its earlier ones: the same figures as one bench
    seeds = sorted(runs["ref"])
    first, rest = tmp_path / "first", tmp_path / "rest"
    later = {"ref": {k: runs["ref"][k] for k in seeds[1:]}, "fast": runs["fast"], "slow": runs["slow"]}
    for folder, part in ((first, {"ref": {k: runs["ref"][k] for k in seeds[:1]}}), (rest, later)):
        folder.mkdir()
        (folder / "results.json").write_text(json.dumps(build_results(part)))
    assert merge([str(first), str(rest), "--reference", "ref", "--out", str(tmp_path / "joined")]) == 0
    joined = json.loads((tmp_path / "joined" / "results.json").read_text())
    assert joined["methods"]["ref"]["final_score"] == whole["methods"]["ref"]["final_score"]
    assert joined["reach_ratios"] == whole["reach_ratios"] and joined["pairwise"] == whole["pairwise"]
    assert merge([str(one), str(tmp_path / "none"), "--reference", "ref", "--out", str(tmp_path / "x")]) == 2
    # methods chosen from a report, one under a new name: the same figures as under its own name
    renamed = tmp_path / "renamed"
    assert merge([str(one), f"{two}:fast=quick", "--reference", "ref", "--out", str(renamed)]) == 0
    picked = json.loads((renamed / "results.json").read_text())
    assert list(picked["methods"]) == ["ref", "quick"]
    pair = build_results({n: runs[n] for n in ("ref", "fast")})
    assert picked["methods"]["quick"]["final_score"] == pair["methods"]["fast"]["final_score"]
    assert merge([str(one), f"{two}:nothing", "--reference", "ref", "--out", str(tmp_path / "x")]) == 2


def test_merging_at_a_shorter_budget_cuts_every_curve(runs: dict[str, dict[int, Path]], tmp_path: Path) -> None:
    """bench-merge --max-nfe: runs cut at their first evaluation at or past the budget compare as runs of that
    budget would: final figures, pairwise tests and reach ratios equal those of runs that stopped there."""

    two = {n: runs[n] for n in ("ref", "fast")}  # two methods keep the bootstraps short
    whole = tmp_path / "whole"
    whole.mkdir()
    full = build_results(two)
    (whole / "results.json").write_text(json.dumps(full))
    assert merge([str(whole), "--reference", "ref", "--out", str(tmp_path / "cut"), "--max-nfe", "100"]) == 0
    cut = json.loads((tmp_path / "cut" / "results.json").read_text())
    r = tmp_path / "short"
    short = {
        "ref": {0: write_run(r / "ref0", [(0, 0.2), (100, 0.4)]), 1: write_run(r / "ref1", [(0, 0.2), (100, 0.6)])},
        "fast": {
            0: write_run(r / "f0", [(0, 0.2), (50, 0.5), (100, 0.8)]),
            1: write_run(r / "f1", [(0, 0.2), (100, 0.8)]),
        },
    }
    stopped = build_results(short)
    for name in two:
        assert cut["methods"][name]["final_score"] == stopped["methods"][name]["final_score"]
        assert cut["methods"][name]["curve_nfe"] == stopped["methods"][name]["curve_nfe"]
    assert cut["pairwise"] == stopped["pairwise"] and cut["reach_ratios"] == stopped["reach_ratios"]
    assert cut["methods"]["ref"]["final_score"] != full["methods"]["ref"]["final_score"]


def test_the_leaderboard_ranks_every_method_of_a_report(
    runs: dict[str, dict[int, Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """flowrl bench-leaderboard: one row per method, best final mean first, the reference marked, the labels
    in the method column; a folder without a report is one line and exit 2."""
    report = tmp_path / "report"
    report.mkdir()
    results = build_results(runs)
    (report / "results.json").write_text(json.dumps(results))
    capsys.readouterr()
    assert flowrl_main(["bench-leaderboard", str(report), "--labels", "ref=Reference,fast=Fast"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("| Welch p vs Reference |")
    body = [line.split(" | ") for line in lines[2:]]
    assert [row[1].strip("`") for row in body] == sorted(
        results["methods"], key=lambda n: -results["methods"][n]["final_score"]["mean"]
    )
    by_name = {row[1].strip("`"): row for row in body}
    assert by_name["ref"][-1] == "(reference) |" and by_name["fast"][2] == "Fast" and by_name["slow"][2] == "slow"
    assert flowrl_main(["bench-leaderboard", str(tmp_path)]) == 2
    assert "results.json: no such file" in capsys.readouterr().err


def test_results_md_says_what_was_run_and_what_an_interval_without_a_mean_value_is(
    runs: dict[str, dict[int, Path]]
) -> None:
    """The pairwise note counts the seeds that were run (not a fixed "3 to 5"); a ratio the mean curve never
    reaches but some resamples do reads as such, not as "not reached [0.73, 0.73]"."""
    results = build_results(runs)
    md = markdown(results)
    assert "Seeds are the samples (2 per method)" in md
    three = build_results({**runs, "ref": {**runs["ref"], 9: runs["ref"][min(runs["ref"])]}})
    assert "Seeds are the samples (2 to 3 per method)" in markdown(three)
    cell = results["reach_ratios"]["ref"]["slow"]
    cell.update(ratio=None, why="not reached", low=0.73, high=0.73, undefined=0.9)
    line = next(row for row in markdown(results).splitlines() if row.startswith("| slow |") and "resamples" in row)
    assert "not reached by the mean curve; 10% of resamples reach it, [0.73, 0.73]" in line
    assert "not reached [0.73" not in markdown(results)
