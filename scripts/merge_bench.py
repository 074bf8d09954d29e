"""Compare the methods of several `flowrl bench` reports (results.json) as one bench: a method measured in an
earlier report need not be trained again, and more seeds of a method (another report, other seeds) join its
earlier ones. Every comparison (pairwise tests, reach ratios on every axis the
runs share) is computed anew; the reports must use the same metric.

    python scripts/merge_bench.py DIR [DIR ...] --reference NAME --out OUT
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from flowrl.bench.plots import plot_curves
from flowrl.bench.report import compare_methods, markdown, method_summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", type=Path, help="bench report folders holding results.json")
    parser.add_argument("--reference", required=True, help="the method the others are compared with")
    parser.add_argument("--out", required=True, type=Path, help="folder for the merged results.json, .md, plots")
    args = parser.parse_args(argv)
    methods, metrics, sources = {}, set(), []
    for folder in args.dirs:
        path = folder / "results.json"
        if not path.is_file():
            print(f"error: {path}: no such file (a flowrl bench report folder holds one)", file=sys.stderr)
            return 2
        results = json.loads(path.read_text())
        metrics.add(results["metric"])
        sources.append(str(folder))
        for name, summary in results["methods"].items():
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
