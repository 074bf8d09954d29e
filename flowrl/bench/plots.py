"""The bench plots: held-out score against NFE and against wall time, one line per method.

Each line is the mean over seeds; the band around it spans the seeds' min to max. The dashed line is the
reference method's final mean score (the target of "NFE to reach ref"). Drawn with the Agg canvas only
(no pyplot state), so plotting works headless and never changes the process's backend.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

PLOTS = {"curve_nfe": ("score_vs_nfe.png", "rollout NFE (cumulative transformer evaluations)"),
         "curve_wall_s": ("score_vs_wall_s.png", "training wall time (s, evaluation excluded)")}


def plot_curves(results: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """Write one PNG per x axis (see :data:`PLOTS`) into ``out_dir``; return their paths."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    paths = []
    for key, (filename, xlabel) in PLOTS.items():
        fig = Figure(figsize=(7, 4.5), dpi=100)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        for i, (name, method) in enumerate(results["methods"].items()):
            curve, colour = method[key], f"C{i % 10}"
            n = method["final_score"]["n"]
            marker = "." if len(curve["x"]) < 30 else None
            ax.plot(curve["x"], curve["mean"], color=colour, label=f"{name} (n={n})", marker=marker)
            if n > 1:
                ax.fill_between(curve["x"], curve["min"], curve["max"], color=colour, alpha=0.2, linewidth=0)
        ax.axhline(results["target_score"], color="0.4", linestyle="--", linewidth=1,
                   label=f"{results['reference']} final mean")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"held-out {results['metric']}")
        ax.set_title("mean over seeds; band: min–max over seeds")
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize="small")
        fig.tight_layout()
        path = Path(out_dir) / filename
        fig.savefig(path, format="png")
        paths.append(path)
    return paths
