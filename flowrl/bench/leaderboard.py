"""The leaderboard table (``flowrl bench-leaderboard``), from a bench report (often a merged one).

One row per method, best final mean first: the seeds, the final held-out figure (mean ± standard error and the
95% t-interval of the mean), the rollout NFE and training seconds a run took (mean over seeds), the iteration
seconds, and Welch's two-sided p against the report's reference. Every figure is read or computed from the
report's seeds; nothing is typed in.
"""

from __future__ import annotations

import statistics
from typing import Any

# Two-sided 95% quantiles of Student's t by degrees of freedom (seeds - 1).
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each method's leaderboard figures, best final mean first."""
    reference = results["reference"]
    p_value = {pair["b"] if pair["a"] == reference else pair["a"]: pair["p"]
               for pair in results["pairwise"] if reference in (pair["a"], pair["b"])}
    out = []
    for name, summary in results["methods"].items():
        seeds = list(summary["seeds"].values())
        finals = [float(s["final"]["eval"][results["metric"]]) for s in seeds]
        mean = statistics.fmean(finals)
        se = statistics.stdev(finals) / len(finals) ** 0.5 if len(finals) > 1 else None
        half = T95[len(finals) - 1] * se if se is not None else None
        out.append({
            "name": name, "seeds": len(finals), "mean": mean, "se": se,
            "interval": (mean - half, mean + half) if half is not None else None,
            "nfe": statistics.fmean(float(s["nfe_used"]) for s in seeds),
            "wall_s": statistics.fmean(float(s["wall_s"]) for s in seeds),
            "iteration_s": statistics.fmean(float(s["iteration_s_mean"]) for s in seeds),
            "p": p_value.get(name),
        })
    return sorted(out, key=lambda row: -row["mean"])


def leaderboard(results: dict[str, Any], labels: dict[str, str]) -> str:
    """The markdown table; ``labels`` maps a recipe name to the method column's text (default: the name)."""
    reference = labels.get(results["reference"], results["reference"])
    columns = ["", "recipe", "method", "seeds", "final test strict, mean ± se", "95% interval", "rollout NFE",
               "training s", "iteration s", f"Welch p vs {reference}"]
    align = ["---:", "---", "---", *["---:"] * 7]
    lines = ["| " + " | ".join(columns) + " |", "| " + " | ".join(align) + " |"]
    for rank, row in enumerate(rows(results), 1):
        interval = f"{row['interval'][0]:.3f} - {row['interval'][1]:.3f}" if row["interval"] else ""
        se = f" ± {row['se']:.3f}" if row["se"] is not None else ""
        p = "(reference)" if row["p"] is None else f"{row['p']:.2g}" + (" **yes**" if row["p"] < 0.05 else "")
        lines.append(
            f"| {rank} | `{row['name']}` | {labels.get(row['name'], row['name'])} | {row['seeds']} |"
            f" {row['mean']:.3f}{se} | {interval} | {row['nfe']:,.0f} | {row['wall_s']:,.0f} |"
            f" {row['iteration_s']:.1f} | {p} |"
        )
    return "\n".join(lines) + "\n"
