"""Plot training metrics of several runs side by side: one panel per metric, one line per run, step on the x axis.

    python scripts/metric_curves.py runs/bench-a/runs/crd/seed* runs/bench-b/runs/crd_kl1/seed* \
        --keys crd/implicit_abs,kl,lagged/distance,eval/strict --out curves.png [--smooth 9] [--log crd/implicit_abs]

Each RUN is a run folder (its ``metrics.jsonl``); runs of one method (one parent folder, as a bench lays them
out) share a colour and a legend entry. ``--smooth K`` draws the running mean over K iterations (evaluation
keys, logged only every few thousand NFE, are drawn as points joined by lines, never smoothed). ``--log`` puts the
named keys on a log scale; ``--labels crd=paper anchor,...`` names the methods in the legend. A key that a run
never logged is left out of that run's panel; a run folder without ``metrics.jsonl`` is an error naming it
(exit status 2).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def series(path: Path, key: str) -> tuple[list[float], list[float]]:
    steps, values = [], []
    for line in (path / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if key in row and "step" in row:
            steps.append(float(row["step"]))
            values.append(float(row[key]))
    return steps, values


def running_mean(values: list[float], k: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= k:
            total -= values[i - k]
        out.append(total / min(i + 1, k))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders")
    parser.add_argument("--keys", required=True, help="comma-separated metrics.jsonl keys, one panel each")
    parser.add_argument("--out", required=True, type=Path, help="the PNG to write")
    parser.add_argument("--smooth", type=int, default=1, help="running mean over this many iterations (default 1)")
    parser.add_argument("--log", default="", help="comma-separated keys drawn on a log scale")
    parser.add_argument("--labels", default="", help="legend labels by method folder: name=label,...")
    args = parser.parse_args(argv)
    for run in args.runs:
        if not (run / "metrics.jsonl").is_file():
            print(f"error: {run}: no metrics.jsonl (not a run folder)", file=sys.stderr)
            return 2
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in args.keys.split(",") if k]
    logs = set(filter(None, args.log.split(",")))
    names = dict(item.split("=", 1) for item in args.labels.split(",") if "=" in item)
    methods = sorted({run.parent.name for run in args.runs})
    colours = {m: plt.get_cmap("tab10")(i % 10) for i, m in enumerate(methods)}
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.4), squeeze=False)
    for ax, key in zip(axes[0], keys, strict=True):
        for run in args.runs:
            steps, values = series(run, key)
            if not steps:
                continue
            evaluation = key.startswith("eval/")
            shown = values if evaluation or args.smooth <= 1 else running_mean(values, args.smooth)
            method = run.parent.name
            first = run == next(r for r in args.runs if r.parent.name == method)
            label = names.get(method, method) if first else None
            ax.plot(steps, shown, color=colours[method], alpha=0.75, lw=1.2, marker="o" if evaluation else None,
                    ms=3, label=label)
        ax.set_title(key + ("" if key.startswith("eval/") or args.smooth <= 1 else f" (mean of {args.smooth})"))
        ax.set_xlabel("step")
        if key in logs:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
