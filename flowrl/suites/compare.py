"""Several checkpoints on one suite: one table with 95% intervals and paired tests against the first column.

Every column of a suite saw the same prompts with the same initial noise (the protocol fixes both), so the
columns are compared prompt by prompt: the difference of each prompt's figure (the mean over its images) is
tested with a paired t-test (two-sided, n - 1 degrees of freedom) and its mean given a t interval. A result
made under another protocol than the suite's pinned one, or on a subset of its prompts, is not comparable
with the published figures: it gets its own table, never a column beside the pinned ones.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flowrl.suites.stages import SUMMARY, SuiteError


def t_quantile(p: float, df: float) -> float:
    """The t value with two-sided tail probability ``p`` (bisection on Student's t tail of flowrl.bench.stats)."""
    from flowrl.bench.stats import t_two_sided_p  # here: the run report reads these tables without the bench

    low, high = 0.0, 1e6
    for _ in range(200):
        mid = (low + high) / 2
        if t_two_sided_p(mid, df) > p:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def mean_interval(values: Sequence[float]) -> tuple[float, float]:
    """The mean and the half-width of its 95% t interval (NaN below two values)."""
    n = len(values)
    mean = statistics.fmean(values) if n else math.nan
    if n < 2:
        return mean, math.nan
    return mean, t_quantile(0.05, n - 1) * statistics.stdev(values) / math.sqrt(n)


def paired(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """``b - a`` prompt by prompt: the mean difference, its 95% half-width, t and the two-sided p-value."""
    diffs = [y - x for x, y in zip(a, b, strict=True)]
    mean, half = mean_interval(diffs)
    n = len(diffs)
    sd = statistics.stdev(diffs) if n > 1 else math.nan
    if n < 2 or sd == 0:
        t = math.nan if n < 2 or mean == 0 else math.copysign(math.inf, mean)
        p = math.nan if n < 2 else (1.0 if mean == 0 else 0.0)
    else:
        from flowrl.bench.stats import t_two_sided_p

        t = mean / (sd / math.sqrt(n))
        p = t_two_sided_p(t, n - 1)
    return {"diff": mean, "half_width": half, "t": t, "p": p, "n": n}


def load_summary(folder: Path) -> dict[str, Any]:
    path = Path(folder) / SUMMARY
    if not path.exists():
        raise SuiteError(f"{path} is missing: score {folder} first (flowrl suite score)")
    try:
        return dict(json.loads(path.read_text()))
    except ValueError:
        raise SuiteError(f"{path} is not valid JSON; score {folder} again") from None


def comparable(summary: dict[str, Any]) -> bool:
    return bool(summary.get("pinned")) and summary.get("limit") is None and bool(summary.get("complete"))


def compare(folders: Sequence[Path]) -> dict[str, Any]:
    """The comparison of result folders of one suite (the first is the baseline): per figure and column the mean
    with its interval, and per later column the paired test against the baseline on the prompts both have."""
    summaries = [load_summary(f) for f in folders]
    suites = {s["suite"] for s in summaries}
    if len(suites) != 1:
        raise SuiteError(f"results of different suites ({', '.join(sorted(suites))}) cannot share a table")
    tables = []
    for group in (True, False):
        chosen = [(f, s) for f, s in zip(folders, summaries, strict=True) if comparable(s) == group]
        if chosen:
            tables.append(_table([f for f, _ in chosen], [s for _, s in chosen], group))
    return {"suite": summaries[0]["suite"], "tables": tables}


def _table(folders: Sequence[Path], summaries: Sequence[dict[str, Any]], pinned: bool) -> dict[str, Any]:
    base = summaries[0]
    figures = [k for k in base["per_prompt"][0] if not k.startswith("_")] if base["per_prompt"] else []
    rows = []
    for figure in figures:
        for category in ["", *sorted(set(base["categories"]) - {""})]:
            row: dict[str, Any] = {"figure": figure if not category else f"{figure}/{category}", "columns": []}
            values = [_values(s, figure, category) for s in summaries]
            for i, found in enumerate(values):
                mean, half = mean_interval(list(found.values()))
                cell: dict[str, Any] = {"mean": mean, "half_width": half, "prompts": len(found)}
                if i:
                    shared = sorted(set(values[0]) & set(found))
                    cell["vs_first"] = paired([values[0][p] for p in shared], [found[p] for p in shared])
                row["columns"].append(cell)
            rows.append(row)
    aggregate = [{k: s["figures"].get(k) for k in s["figures"]} for s in summaries]
    return {"pinned": pinned, "tags": [s["tag"] for s in summaries], "folders": [str(f) for f in folders],
            "protocols": [s["protocol"] for s in summaries], "rows": rows, "aggregate": aggregate,
            "primary": base.get("primary", figures[0] if figures else "")}


def _values(summary: dict[str, Any], figure: str, category: str) -> dict[int, float]:
    return {p: f[figure] for p, f, c in zip(summary["prompts"], summary["per_prompt"], summary["categories"],
                                             strict=True) if not category or c == category}


def cell_text(cell: dict[str, Any]) -> str:
    """A table cell: the mean with its 95% half-width, and for later columns the paired difference and p."""
    text = f"{cell['mean']:.4f} ± {cell['half_width']:.4f}" if math.isfinite(cell["half_width"]) else \
        f"{cell['mean']:.4f}"
    test = cell.get("vs_first")
    if test:
        p = f"p = {test['p']:.3g}" if math.isfinite(test["p"]) else "p n/a"
        text += f" ({test['diff']:+.4f}, {p})"
    return text


def markdown(result: dict[str, Any]) -> str:
    """The comparison as markdown: one table per comparability group."""
    lines = [f"# Suite {result['suite']}", ""]
    for table in result["tables"]:
        title = "pinned protocol (comparable with published figures)" if table["pinned"] else \
            "NOT comparable: another protocol or a subset of the prompts"
        lines += [f"## {title}", "", "Means over prompts with 95% t intervals; later columns: the paired difference "
                  "from the first column on the same prompts and noise, and its two-sided p-value.", ""]
        lines.append("| figure | " + " | ".join(table["tags"]) + " |")
        lines.append("| --- |" + " --- |" * len(table["tags"]))
        for row in table["rows"]:
            lines.append(f"| {row['figure']} | " + " | ".join(cell_text(c) for c in row["columns"]) + " |")
        lines += ["", "Protocols: " + "; ".join(f"{t}: {json.dumps(p)}" for t, p in
                                                 zip(table["tags"], table["protocols"], strict=True)), ""]
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    """Bars of the headline figure per column and category, with the 95% intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tables = result["tables"]
    fig, axes = plt.subplots(1, len(tables), figsize=(6 * len(tables), 4), squeeze=False)
    for ax, table in zip(axes[0], tables, strict=True):
        primary = table["primary"]
        rows = [r for r in table["rows"] if r["figure"] == primary or r["figure"].startswith(primary + "/")]
        width = 0.8 / max(len(table["tags"]), 1)
        for i, tag in enumerate(table["tags"]):
            means = [r["columns"][i]["mean"] for r in rows]
            errors = [r["columns"][i]["half_width"] if math.isfinite(r["columns"][i]["half_width"]) else 0.0
                      for r in rows]
            ax.bar([k + i * width for k in range(len(rows))], means, width, yerr=errors, capsize=3, label=tag)
        ax.set_xticks([k + 0.4 - width / 2 for k in range(len(rows))])
        ax.set_xticklabels([r["figure"].split("/", 1)[1] if "/" in r["figure"] else "all" for r in rows],
                           rotation=30, ha="right")
        ax.set_ylabel(primary)
        ax.set_title(f"{result['suite']}: " + ("pinned protocol" if table["pinned"] else "not comparable"))
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
