"""The summary a person reads when a training run ends, made from the run folder alone (metrics.jsonl and
checkpoints/best), so a resumed run's summary covers the whole run."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from flowrl.trainer.checkpoints.folder import BEST, STATE
from flowrl.trainer.checkpoints.saving import best_figure
from flowrl.trainer.runfolder import read_metrics


def _value(row: dict[str, Any], key: str) -> float:
    """A figure of a metrics row; NaN where it is absent or was not finite (metrics.jsonl keeps those as null)."""
    value = row.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else math.nan


def _number(value: float) -> str:
    return f"{value:.3f}" if math.isfinite(value) else "non-finite"


def _with_se(row: dict[str, Any], key: str) -> str:
    value, se = _value(row, key), _value(row, f"{key}_se")
    return f"{_number(value)} ± {se:.3f}" if math.isfinite(value) and math.isfinite(se) else _number(value)


def _best(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / "checkpoints" / BEST / STATE
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) and isinstance(state.get("best"), dict) else None


def _alerts(rows: list[dict[str, Any]]) -> list[str]:
    """Each alert that fired, with the steps of its first and last flagged row and the number of rows."""
    seen: dict[str, list[int]] = {}
    for row in rows:
        for key in row:
            if key.startswith("alert/"):
                seen.setdefault(key, []).append(int(row["step"]))
    return [f"{key} at {len(steps)} step(s), {steps[0]}..{steps[-1]}" for key, steps in seen.items()]


def run_summary(run_dir: Path, keep_best: str = "auto", recipe: Any = None) -> str:
    """Lines for the end of ``flowrl train``: iterations and NFE, the update mode the run used (given its
    ``recipe``), the first and last evaluation with their standard errors, the best step and its checkpoint, the
    alerts that fired, and the commands to run next."""
    rows = read_metrics(run_dir / "metrics.jsonl")
    trained = [r for r in rows if r.get("step", 0) > 0 and "loss" in r]
    lines = [f"run folder: {run_dir}"]
    if not rows:
        return "\n".join([*lines, "no iteration was logged (metrics.jsonl is empty)"])
    last = rows[-1]
    lines.append(f"trained: {last['step']} iterations, {last.get('nfe', 0):,} rollout NFE, "
                 f"{last.get('wall_s', 0.0):.0f} s (evaluations not counted)")
    if recipe is not None and trained:
        lines.append(update_line(recipe, trained))
    if last.get("skipped_steps"):
        lines.append(f"skipped: {last['skipped_steps']} iterations for NaN or inf")
    evals = [r for r in rows if any(k.startswith("eval/") for k in r)]
    best = _best(run_dir)
    named = keep_best not in ("", "auto") and bool(evals) and keep_best in evals[-1]
    key = keep_best if named else (best_figure(evals[-1], "auto")[0] if evals else "")
    if not evals:
        lines.append("evaluation: none ran (trainer.eval_every and eval_every_nfe are 0); only training rewards")
    elif not key:
        found = ", ".join(sorted(k for k in evals[-1] if k.startswith("eval/"))) or "none"
        lines.append(f"evaluation: the reward reports no eval/strict or eval/score figure ({found})")
    else:
        first, final = evals[0], evals[-1]
        change = _value(final, key) - _value(first, key)
        moved = f"{change:+.3f}; " if math.isfinite(change) else ""
        lines.append(f"{key}: {_with_se(first, key)} at step {first['step']} -> {_with_se(final, key)} at step "
                     f"{final['step']} ({moved}± one standard error; held-out prompts, deterministic ODE samples)")
        folder = run_dir / "checkpoints" / BEST
        if best is not None and math.isfinite(float(best["best"]["value"])):
            initial = " (the initial weights: no later evaluation beat them)" if best["step"] == 0 else ""
            lines.append(f"best: {best['best']['figure']} {best['best']['value']:.3f} at step {best['step']}{initial}, "
                         f"weights in {folder}")
        else:
            lines.append(f"best: no evaluation beat step {first['step']}'s {_number(_value(first, key))}; no {folder}")
    if trained and "reward/total" in trained[0]:
        lines.append(f"training reward: {_number(_value(trained[0], 'reward/total'))} at step {trained[0]['step']} "
                     f"-> {_number(_value(trained[-1], 'reward/total'))} at step {trained[-1]['step']} (SDE rollouts)")
    alerts = _alerts(rows)
    lines.append("alerts: " + ("; ".join(alerts) + " (flowrl report shows when)" if alerts else "none fired"))
    lines.append("next:")
    lines.append(f"  flowrl report {run_dir}                     # curves, alerts, samples over the run (HTML)")
    if evals and best is not None:
        lines.append(f"  flowrl eval {run_dir} --checkpoint best     # the best evaluation's weights again")
    lines.append(f"  flowrl sample {run_dir} --prompt \"...\" --out samples.png")
    return "\n".join(lines)


def update_line(recipe: Any, trained: list[dict[str, Any]]) -> str:
    """What ``trainer.update`` did: retain (with the largest graphs it kept) or recompute, and why under auto.
    Iterations that kept graphs log ``update/retained_mb`` (and ``update/checkpointed_rows``, the rows whose
    graph kept only its blocks' inputs under the memory budget); under auto a run whose graphs outgrew the memory
    stops logging it and recomputes from then on."""
    from flowrl.config.update_modes import retain_conflicts

    asked = recipe.trainer.update
    kept = [r for r in trained if "update/retained_mb" in r]
    source = f"trainer.update = {asked}"
    if kept and kept[-1] is trained[-1]:
        most = max(float(r["update/retained_mb"]) for r in kept)
        why = ": exact for this recipe" if asked == "auto" else ""
        line = f"update: retain ({source}{why}); the rollouts kept graphs of at most {most:,.1f} MB an iteration"
        checkpointed = sum(int(r.get("update/checkpointed_rows", 0)) for r in kept)
        if checkpointed:
            rows = sum(int(r["update/retained_rows"]) for r in kept)
            budget = recipe.trainer.memory_budget
            bound = f"trainer.memory_budget = {budget}" if budget != "" else "90% of the free memory"
            line += (f", {checkpointed:,} of their {rows:,} rows checkpointed (only each block's input kept) to stay"
                     f" within {bound}")
        return line
    if kept:
        budget = recipe.trainer.memory_budget
        room = f"trainer.memory_budget = {budget}" if budget != "" else "the memory free on the device"
        return (f"update: retain until step {kept[-1]['step']}, then recompute ({source}: the retained graphs"
                f" outgrew {room})")
    if asked == "auto":
        conflicts = retain_conflicts(recipe)
        why = (f"retain is not exact with {conflicts[0][0]}: {conflicts[0][1]}" if conflicts
               else "retain is not exact: the transformer has active dropout, or no trained input was kept")
        return f"update: recompute ({source}: {why})"
    return f"update: recompute ({source})"
