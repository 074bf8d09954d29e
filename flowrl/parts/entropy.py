"""Entropy of denoising transitions: how much a stochastic step (or a merged jump) can explore.

For an SDE jump from step ``i`` over ``m`` grid steps the kernel's std is evaluated at ``s_i`` with
``dt = s_{i+m} - s_i``; its per-dimension entropy is ``0.5 log(2 pi e) + log std`` (docs/algorithms.md, entropy).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from flowrl.core.interfaces import entropy_per_dim
from flowrl.core.types import Schedule


def jump_std(schedule: Schedule, start: int, merge: int) -> float:
    """The kernel's std for one jump ``s_start -> s_{start+merge}``."""
    s = torch.tensor([schedule.sigmas[start]])
    s_next = torch.tensor([schedule.sigmas[start + merge]])
    return float(schedule.kernel.std_only(s, s_next, schedule.s_at_one)[0])


def merged_entropy(schedule: Schedule, start: int, merge: int) -> float:
    """Per-dimension entropy (nats) of one jump from ``start`` over ``merge`` steps (-inf when std is 0)."""
    std = jump_std(schedule, start, merge)
    return float(entropy_per_dim(torch.tensor([std]))[0]) if std > 0 else -math.inf


def entropy_table(schedule: Schedule, max_merge: int) -> list[dict[str, float | int | None]]:
    """One row per step: sigma, the single-step std, and the entropy for merges 1..max_merge."""
    n = schedule.num_steps
    rows: list[dict[str, float | int | None]] = []
    for i in range(n):
        row: dict[str, float | int | None] = {"step": i, "sigma": schedule.sigmas[i], "std": jump_std(schedule, i, 1)}
        for m in range(1, max_merge + 1):
            row[f"h_m{m}"] = merged_entropy(schedule, i, m) if i + m <= n else None
        rows.append(row)
    return rows


def format_table(rows: list[dict[str, float | int | None]]) -> str:
    """A fixed-width text table of :func:`entropy_table`'s rows."""
    keys = list(rows[0])
    lines = ["  ".join(f"{k:>7}" for k in keys)]
    for row in rows:
        cells = []
        for key in keys:
            value = row[key]
            cells.append(
                f"{'-':>7}" if value is None else f"{value:>7d}" if isinstance(value, int) else f"{value:>7.3f}"
            )
        lines.append("  ".join(cells))
    return "\n".join(lines)


def plot_entropy(
    rows: list[dict[str, float | int | None]], path: Path, units: list[tuple[int, int]], title: str
) -> None:
    """Entropy per timestep, one line per merge count, the selector's units marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    merges = [k for k in rows[0] if k.startswith("h_m")]
    fig, ax = plt.subplots(figsize=(7, 4))
    for key in merges:
        points = [(r["step"], r[key]) for r in rows if r[key] is not None and math.isfinite(float(r[key]))]  # type: ignore[arg-type]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", ms=3, label=f"merge {key[3:]}")
    for start, merge in units:
        ax.axvspan(start - 0.4, start + 0.4, color="tab:red", alpha=0.15)
        ax.annotate(f"({start},{merge})", (start, ax.get_ylim()[1]), fontsize=7, ha="center", va="top")
    ax.set_xlabel("start step i")
    ax.set_ylabel("entropy per dimension (nats)")
    ax.set_title(title)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
