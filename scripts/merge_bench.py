"""Compare the methods of several `flowrl bench` reports (results.json) as one bench: a method measured in an
earlier report need not be trained again, and more seeds of a method (another report, other seeds) join its
earlier ones. Every comparison (pairwise tests, reach ratios on every axis the
runs share) is computed anew; the reports must use the same metric. ``--max-nfe N`` cuts every seed's curve at
its first evaluation at or past N rollout NFE, so longer runs compare at a shorter budget (with a constant
learning rate a run of budget N follows the same trajectory to that point); a cut run's final figure is that
evaluation's metric alone, and its cost figures (iteration seconds, outside share, peak memory) stay those of
the whole run.

    python scripts/merge_bench.py DIR [DIR ...] --reference NAME --out OUT [--max-nfe N]

A DIR may name the methods to take from it, each optionally under a new name:
``DIR:flow_grpo=flow_grpo_p4,branch_grpo`` takes two of its methods and calls the first ``flow_grpo_p4`` (so one
method measured under two protocols can stand side by side).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from flowrl.bench.plots import plot_curves
from flowrl.bench.report import compare_methods, markdown, method_summary


def cut_seed(seed: dict[str, Any], max_nfe: float, metric: str) -> dict[str, Any]:
    """``seed`` (a results.json seed entry) as if its run had stopped at its first evaluation at or past
    ``max_nfe`` rollout NFE (unchanged when its curve ends before)."""
    curve = seed["curve"]
    ends = [i for i, nfe in enumerate(curve["nfe"]) if nfe >= max_nfe]
    if not ends or ends[0] == len(curve["nfe"]) - 1:
        return seed
    end = ends[0] + 1
    cut = {k: v[:end] for k, v in curve.items()}
    last = {k: cut[k][-1] for k in ("step", "nfe", "wall_s", "score")}
    return {**seed, "curve": cut, "final": {**last, "eval": {metric: last["score"]}}, "steps": last["step"],
            "nfe_used": last["nfe"], "wall_s": last["wall_s"]}


def parse_source(spec: str) -> tuple[Path, dict[str, str] | None]:
    """``DIR`` or ``DIR:NAME[=NEW],...``: the folder and the methods to take from it (each to its new name), or
    None for all of them."""
    folder, sep, names = spec.rpartition(":") if ":" in spec else (spec, "", "")
    if not sep:
        return Path(spec), None
    chosen = {}
    for item in names.split(","):
        old, _, new = item.partition("=")
        chosen[old.strip()] = (new or old).strip()
    return Path(folder), chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", help="bench report folders holding results.json (DIR[:NAME[=NEW],...])")
    parser.add_argument("--reference", required=True, help="the method the others are compared with")
    parser.add_argument("--out", required=True, type=Path, help="folder for the merged results.json, .md, plots")
    parser.add_argument("--max-nfe", type=float, default=None,
                        help="compare at this rollout budget: cut longer runs at their first evaluation past it")
    args = parser.parse_args(argv)
    methods: dict[str, Any] = {}
    metrics: set[str] = set()
    sources: list[str] = []
    for spec in args.dirs:
        folder, chosen = parse_source(spec)
        path = folder / "results.json"
        if not path.is_file():
            print(f"error: {path}: no such file (a flowrl bench report folder holds one)", file=sys.stderr)
            return 2
        results = json.loads(path.read_text())
        metrics.add(results["metric"])
        sources.append(spec)
        missing = [name for name in chosen or {} if name not in results["methods"]]
        if missing:
            print(f"error: {spec}: no method '{missing[0]}' in {path} ({', '.join(results['methods'])})",
                  file=sys.stderr)
            return 2
        for original, summary in results["methods"].items():
            if chosen is not None and original not in chosen:
                continue
            name = chosen[original] if chosen is not None else original
            if args.max_nfe is not None:
                cut = {k: cut_seed(v, args.max_nfe, results["metric"]) for k, v in summary["seeds"].items()}
                summary = method_summary(cut)
            if name in methods:  # more seeds of one method: the seeds join, the summary is computed anew
                shared = sorted(set(methods[name]["seeds"]) & set(summary["seeds"]), key=int)
                if shared:
                    print(f"error: method '{name}' has seed {shared[0]} in more than one report ({path})",
                          file=sys.stderr)
                    return 2
                summary = method_summary({**methods[name]["seeds"], **summary["seeds"]})
            methods[name] = summary
    if len(metrics) != 1:
        print(f"error: the reports use different metrics: {', '.join(sorted(metrics))}", file=sys.stderr)
        return 2
    if args.reference not in methods:
        print(f"error: --reference {args.reference}: not a method of these reports ({', '.join(methods)})",
              file=sys.stderr)
        return 2
    merged = compare_methods(methods, args.reference, metrics.pop(), {"merged_from": sources})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(merged, indent=2, allow_nan=False) + "\n")
    (args.out / "results.md").write_text(markdown(merged))
    plot_curves(merged, args.out)
    print(f"wrote {args.out}/results.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
