"""The bench report: run folders -> ``results.json``, ``results.md`` and plots.

:func:`write_report` is a pure function of the run folders (``metrics.jsonl``, plus the harness's
``final_eval.json`` when present), so it can be re-run on finished runs and tested on synthetic files.

Curves are the held-out metric at each evaluation, against cumulative rollout NFE and training wall time
(:mod:`~flowrl.bench.curve` averages them over seeds).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from flowrl.bench.bench_errors import BenchError
from flowrl.bench.compare import AXES, SIGNIFICANCE, has_axis, pairwise, reach_levels, reach_ratios
from flowrl.bench.curve import mean_curve, stats, x_to_reach
from flowrl.utils.finite import finite_number

DEFAULT_METRIC = "eval/strict"  # strict accuracy: the figure the summary, the suites and docs/world.md report
FALLBACK_METRIC = "eval/score"  # where no strict accuracy is logged (as keep_best = "auto" chooses)
FINAL_EVAL = "final_eval.json"  # the harness's evaluation after the last iteration (a run folder file)
SCHEMA = 1


# -- reading a run folder ----------------------------------------------------------------------
def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of ``metrics.jsonl`` sorted by step; a repeated step keeps its newest row."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise BenchError(f"{run_dir}: no metrics.jsonl (not a finished run folder)")
    rows: dict[int, dict[str, Any]] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise BenchError(f"{path}:{n}: not a JSON object") from None
        if not isinstance(row, dict) or not isinstance(row.get("step"), int):
            raise BenchError(f"{path}:{n}: a row without an integer 'step'")
        rows[row["step"]] = row
    if not rows:
        raise BenchError(f"{path}: empty")
    return [rows[step] for step in sorted(rows)]


def eval_points(run_dir: Path, rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Rows with held-out figures, then the harness's final evaluation if it is later than the last one."""
    points = [dict(row) for row in rows if any(key.startswith("eval/") for key in row)]
    final_file = Path(run_dir) / FINAL_EVAL
    if final_file.is_file():
        try:
            final = json.loads(final_file.read_text())
        except json.JSONDecodeError:
            raise BenchError(f"{final_file}: not a JSON object") from None
        if not points or final.get("nfe", 0) > points[-1].get("nfe", 0):
            points.append(final)
    return points


def _eval_keys(points: Sequence[Mapping[str, Any]]) -> list[str]:
    keys: dict[str, None] = {}
    for point in points:
        keys.update({k: None for k in point if k.startswith("eval/")})
    return list(keys)


def resolve_metric(requested: str | None, points: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    """``requested`` if every run logged it; by default ``eval/strict``, else ``eval/score``, else the first
    ``eval/*`` key all share."""
    keys = {label: _eval_keys(p) for label, p in points.items()}
    for label, found in keys.items():
        if not found:
            raise BenchError(
                f"{label}: no held-out evaluations in metrics.jsonl; bench needs trainer.eval_every > 0 and"
                " held-out prompts (prompts.heldout)"
            )
    if requested is not None:
        for label, found in keys.items():
            if requested not in found:
                raise BenchError(f"{label}: metric '{requested}' was not logged (logged: {', '.join(found)})")
        return requested
    first = next(iter(keys.values()))
    for key in [DEFAULT_METRIC, FALLBACK_METRIC, *first]:
        if all(key in found for found in keys.values()):
            return key
    raise BenchError(f"the runs share no held-out metric (first run logged: {', '.join(first)}); pass --metric")


def _ratio(value: float | None, reference: float | None) -> float | None:
    return value / reference if value is not None and reference else None


def _mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


# -- one seed, one method ----------------------------------------------------------------------
def seed_summary(run_dir: Path, rows: Sequence[Mapping[str, Any]], points: Sequence[Mapping[str, Any]],
                 metric: str) -> dict[str, Any]:
    """A seed's curve (nfe, wall_s, score at each evaluation) and its final and cost figures."""
    scored = [p for p in points if finite_number(p.get(metric)) is not None]
    if not scored:
        raise BenchError(f"{run_dir}: every '{metric}' value is missing or non-finite")
    curve: dict[str, list[Any]] = {
        "step": [int(p.get("step", 0)) for p in scored],
        "nfe": [float(p.get("nfe", 0)) for p in scored],
        "wall_s": [float(p.get("wall_s", 0.0)) for p in scored],
        "score": [float(p[metric]) for p in scored],
    }
    if all(finite_number(p.get("rows")) is not None for p in scored):  # runs before the rows counter lack it
        curve["rows"] = [float(p["rows"]) for p in scored]
    last = scored[-1]
    train = [r for r in rows if r["step"] > 0]

    def column(key: str) -> list[float]:
        return [v for v in (finite_number(r.get(key)) for r in train) if v is not None]

    iteration_s, outside, memory = column("time/iteration_s"), column("time/outside_share"), column("mem/peak_mb")
    return {
        "run_dir": str(run_dir),
        "curve": curve,
        "final": {
            "step": curve["step"][-1],
            "nfe": curve["nfe"][-1],
            "wall_s": curve["wall_s"][-1],
            "score": curve["score"][-1],
            "eval": {k: v for k, v in last.items() if k.startswith("eval/") and finite_number(v) is not None},
        },
        "steps": int(rows[-1]["step"]),
        "nfe_used": float(rows[-1].get("nfe", 0)),
        "wall_s": float(rows[-1].get("wall_s", 0.0)),
        "iteration_s_mean": statistics.fmean(iteration_s) if iteration_s else None,
        "outside_share_mean": statistics.fmean(outside) if outside else None,
        "peak_mem_mb": max(memory) if memory else None,
    }


def method_summary(seeds: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    """Aggregates over a method's seeds (the reference comparison is added by :func:`build_results`)."""
    finals = [s["final"] for s in seeds.values()]
    shared = [k for k in finals[0]["eval"] if all(k in f["eval"] for f in finals)]
    memory = [s["peak_mem_mb"] for s in seeds.values() if s["peak_mem_mb"] is not None]
    return {
        "seeds": dict(seeds),
        "final_score": stats([f["score"] for f in finals]),
        "final_eval": {k: stats([f["eval"][k] for f in finals]) for k in shared},
        "iteration_s_mean": _mean([s["iteration_s_mean"] for s in seeds.values()]),
        "outside_share_mean": _mean([s["outside_share_mean"] for s in seeds.values()]),
        "peak_mem_mb": max(memory) if memory else None,
        "curve_nfe": mean_curve([(s["curve"]["nfe"], s["curve"]["score"]) for s in seeds.values()]),
        "curve_wall_s": mean_curve([(s["curve"]["wall_s"], s["curve"]["score"]) for s in seeds.values()]),
    }


# -- the report --------------------------------------------------------------------------------
def build_results(
    runs: Mapping[str, Mapping[int, Path]],
    reference: str | None = None,
    metric: str | None = None,
    meta: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``results.json`` object for ``runs`` (method -> seed -> run folder)."""
    if not runs or any(not seeds for seeds in runs.values()):
        raise BenchError("nothing to report: every method needs at least one run folder")
    reference = next(iter(runs)) if reference is None else reference
    if reference not in runs:
        raise BenchError(f"unknown reference '{reference}'; methods: {', '.join(runs)}")
    rows = {(m, s): read_metrics(Path(d)) for m, seeds in runs.items() for s, d in seeds.items()}
    points = {(m, s): eval_points(Path(runs[m][s]), r) for (m, s), r in rows.items()}
    metric = resolve_metric(metric, {f"{runs[m][s]}": p for (m, s), p in points.items()})
    methods = {
        m: method_summary(
            {str(s): seed_summary(Path(d), rows[m, s], points[m, s], metric) for s, d in sorted(seeds.items())}
        )
        for m, seeds in runs.items()
    }
    return compare_methods(methods, reference, metric, meta)


def compare_methods(methods: dict[str, Any], reference: str, metric: str,
                    meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``results.json`` object from method summaries (``results["methods"]`` of one or more benches of the
    same metric): every comparison against ``reference`` and between pairs, computed anew."""
    if reference not in methods:
        raise BenchError(f"unknown reference '{reference}'; methods: {', '.join(methods)}")
    target = methods[reference]["final_score"]["mean"]
    ref_nfe = x_to_reach(methods[reference]["curve_nfe"], target)
    ref_wall = x_to_reach(methods[reference]["curve_wall_s"], target)
    for summary in methods.values():
        nfe = x_to_reach(summary["curve_nfe"], target)
        wall = x_to_reach(summary["curve_wall_s"], target)
        summary["nfe_to_reach_reference"] = nfe
        summary["nfe_ratio_to_reference"] = _ratio(nfe, ref_nfe)
        summary["wall_s_to_reach_reference"] = wall
        summary["wall_s_ratio_to_reference"] = _ratio(wall, ref_wall)
    return {
        "schema": SCHEMA,
        "metric": metric,
        "reference": reference,
        "target_score": target,
        "bench": dict(meta or {}),
        "methods": methods,
        "pairwise": pairwise(methods),
        "reach_ratios": reach_ratios(methods),
        "reach_ratios_by_axis": {axis: reach_ratios(methods, axis=axis) for axis in AXES if has_axis(methods, axis)},
        "reach_levels": reach_levels(methods),
    }


def _fmt(value: float | None, spec: str = ".4g", missing: str = "—") -> str:
    return missing if value is None else format(value, spec)


def _bootstrap_cell(cell: Mapping[str, Any], value: str, spec: str) -> str:
    """A ratio or NFE cell: the value with its [95% bootstrap], and the share of resamples without one. Where the
    mean curve has no value but some resamples do, the interval is theirs and the cell says so."""
    interval = f"[{_fmt(cell['low'], spec)}, {_fmt(cell['high'], spec)}]" if cell["low"] is not None else ""
    if value in ("not reached", "no gain") and interval:
        return f"{value} by the mean curve; {1 - cell['undefined']:.0%} of resamples reach it, {interval}"
    undef = f" undef {cell['undefined']:.0%}" if cell.get("undefined") else ""
    return f"{value}{' ' + interval if interval else ''}{undef}"


def markdown(results: Mapping[str, Any]) -> str:
    """``results.md``: the method table, the other final figures, the pairwise tests and the NFE ratios."""
    metric, reference = results["metric"], results["reference"]
    bench = results.get("bench", {})
    budget = f" · budget {bench['nfe_budget']} NFE" if "nfe_budget" in bench else ""
    lines = [
        "# flowrl bench",
        "",
        f"Held-out metric `{metric}` · reference `{reference}` (final mean {_fmt(results['target_score'])}){budget}.",
        "",
        f"| method | seeds | final {metric} (mean ± se) | std | min – max | NFE to reach ref | NFE × ref"
        " | wall s to reach ref | iteration s | outside share | peak MB |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, m in results["methods"].items():
        f = m["final_score"]
        cells = [
            name,
            str(f["n"]),
            f"{_fmt(f['mean'])} ± {_fmt(f.get('se'))}",
            _fmt(f["std"]),
            f"{_fmt(f['min'])} – {_fmt(f['max'])}",
            _fmt(m["nfe_to_reach_reference"], ".0f", "not reached"),
            _fmt(m["nfe_ratio_to_reference"], ".3g"),
            _fmt(m["wall_s_to_reach_reference"], ".3g", "not reached"),
            _fmt(m["iteration_s_mean"], ".3g"),
            _fmt(m["outside_share_mean"], ".1%"),
            _fmt(m["peak_mem_mb"], ".0f"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "se: standard error over seeds (std / sqrt(n)). NFE to reach ref: cumulative rollout transformer evaluations",
        "at which the method's mean curve first reaches the reference's final mean (linear between evaluations).",
        "NFE × ref: that, divided by the reference's own. Outside share: fraction of iteration time spent outside",
        "transformer forward/backward. See docs/bench.md.",
        "",
        *_figures_table(results),
        *_pairwise_table(results),
        *_ratio_table(results),
        *_axes_table(results),
    ]
    return "\n".join(lines)


def _figures_table(results: Mapping[str, Any]) -> list[str]:
    """Every final held-out figure the methods share (mean over seeds), other than standard errors."""
    methods = list(results["methods"].values())
    keys = [k for k in methods[0]["final_eval"] if not k.endswith("_se") and all(k in m["final_eval"] for m in methods)]
    keys = [k for k in keys if k.count("/") == 1 or k.startswith("eval/strict/")]  # no per-reward copies
    if not keys:
        return []
    lines = ["## Final held-out figures (mean over seeds)", "", "| method | " + " | ".join(k[5:] for k in keys) + " |",
             "| --- |" + " ---: |" * len(keys)]
    for name, m in results["methods"].items():
        lines.append(f"| {name} | " + " | ".join(_fmt(m["final_eval"][k]["mean"], ".3f") for k in keys) + " |")
    return [*lines, ""]


def _pairwise_table(results: Mapping[str, Any]) -> list[str]:
    rows = results.get("pairwise", [])
    if not rows:
        return []
    lines = [f"## Pairwise differences of the final {results['metric']} (Welch's t-test, two-sided)", "",
             f"| A | B | A − B | se | t | df | p | p < {SIGNIFICANCE:g} |", "| --- | --- |" + " ---: |" * 6]
    for r in rows:
        cells = [r["a"], r["b"], _fmt(r["diff"], "+.4f"), _fmt(r["se"], ".4f"), _fmt(r["t"], ".2f"),
                 _fmt(r["df"], ".1f"), _fmt(r["p"], ".3g"), "yes" if r["significant"] else "no"]
        lines.append("| " + " | ".join(cells) + " |")
    counts = sorted({m["final_score"]["n"] for m in results["methods"].values()})
    per = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]} to {counts[-1]}"
    note = f"Seeds are the samples ({per} per method): a difference not flagged is not shown, not absent."
    return [*lines, "", note, ""]


def _ratio_table(results: Mapping[str, Any]) -> list[str]:
    ratios = results.get("reach_ratios", {})
    names = list(results["methods"])
    if not ratios:
        return []
    lines = [
        "## NFE to reach another method's final level, as a multiple of that method's own NFE", "",
        "Row M, column R: rollout NFE at which M's mean curve first reaches R's final mean, divided by the NFE R's",
        "own mean curve needed; below 1, M gets there with fewer evaluations. [95% percentile bootstrap over",
        "seeds]; \"undef\" is the share of resamples without a ratio (a level never reached, or R's own level reached",
        "at NFE 0).", "",
        "| M \\ R | " + " | ".join(names) + " |", "| --- |" + " ---: |" * len(names),
    ]
    for m in names:
        cells = []
        for r in names:
            cell = ratios.get(r, {}).get(m)
            if m == r or cell is None:
                cells.append("—")
                continue
            cells.append(_bootstrap_cell(cell, _fmt(cell["ratio"], ".2f", cell.get("why") or "not reached"), ".2f"))
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    note = "\"no gain\": R's mean curve starts at or above its final level, so R needed 0 NFE: no ratio exists."
    lines += ["", note, ""]
    return [*lines, *_levels_table(results)]


AXIS_NAMES = {"step": "optimizer steps", "nfe": "rollout NFE", "wall_s": "training seconds", "rows": "transformer rows"}


def _axes_table(results: Mapping[str, Any]) -> list[str]:
    """Each method against the reference on every axis: what it needs to reach the reference's final mean,
    as a multiple of what the reference itself needed."""
    by_axis, ref = results.get("reach_ratios_by_axis", {}), results["reference"]
    axes = [a for a in AXES if a in by_axis]
    if not axes or len(results["methods"]) < 2:
        return []
    lines = [
        f"## To reach {ref}'s final level, on every axis", "",
        f"The multiple of {ref}'s own optimizer steps, rollout NFE, training seconds (evaluation excluded) and",
        "transformer rows (rollout NFE plus the update's forwards and backwards) each method's mean curve needs to",
        f"reach {ref}'s final mean [95% percentile bootstrap over seeds]; below 1 is faster on that axis.", "",
        "| method | " + " | ".join(AXIS_NAMES[a] for a in axes) + " |", "| --- |" + " ---: |" * len(axes),
    ]
    for m in results["methods"]:
        if m == ref:
            continue
        cells = []
        for a in axes:
            cell = by_axis[a].get(ref, {}).get(m)
            if cell is None:
                cells.append("—")
                continue
            cells.append(_bootstrap_cell(cell, _fmt(cell["ratio"], ".2f", cell.get("why") or "not reached"), ".2f"))
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _levels_table(results: Mapping[str, Any]) -> list[str]:
    levels = results.get("reach_levels")
    if not levels:
        return []
    gains = [row["gain"] for row in next(iter(levels["methods"].values()))]
    lines = [
        f"## NFE to rise above the common start ({_fmt(levels['start'], '.4f')})", "",
        "Rollout NFE at which each method's mean curve first reaches the start plus a gain [95% seed bootstrap].", "",
        "| method | " + " | ".join(f"+{g:g}" for g in gains) + " |", "| --- |" + " ---: |" * len(gains),
    ]
    for name, rows in levels["methods"].items():
        cells = []
        for row in rows:
            cells.append(_bootstrap_cell(row, _fmt(row["nfe"], ".0f", "not reached"), ".0f"))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def write_report(
    runs: Mapping[str, Mapping[int, Path]],
    out_dir: Path,
    reference: str | None = None,
    metric: str | None = None,
    meta: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Write ``results.json``, ``results.md`` and the plots for ``runs`` into ``out_dir``; return the results.

    ``runs`` maps method -> seed -> run folder; ``reference`` defaults to the first method; ``metric`` to
    ``eval/strict`` if logged, else ``eval/score``, else the first ``eval/*`` key; ``meta`` is stored as
    ``results["bench"]``.
    """
    from flowrl.bench.plots import plot_curves

    results = build_results(runs, reference, metric, meta)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=2, allow_nan=False) + "\n")
    (out_dir / "results.md").write_text(markdown(results))
    plot_curves(results, out_dir)
    return results
