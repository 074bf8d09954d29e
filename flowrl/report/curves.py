"""The curves of a run report: one small panel per group of related metrics, drawn from ``metrics.jsonl``.

Drawn with matplotlib's Agg canvas only (no pyplot state), returned as PNG bytes for inlining.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

from flowrl.finite import finite_number

# (panel title, metric keys or key prefixes ending in "/"): a panel is drawn when any of its keys is logged.
PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("training reward", ("reward/",)),
    ("held-out evaluation", ("eval/score", "eval/strict")),
    ("held-out strict accuracy by category", ("eval/strict/",)),
    ("KL to the initial policy (per dimension)", ("health/kl_initial",)),
    ("velocity drift from the initial policy", ("health/velocity_drift",)),
    ("within-group diversity", ("health/diversity",)),
    ("groups without reward spread", ("health/zero_spread",)),
    ("clip fraction", ("clip_frac",)),
    ("loss", ("loss",)),
    ("gradient norm", ("grad_norm",)),
    ("rollout NFE (cumulative)", ("nfe",)),
    ("training wall time (s)", ("wall_s",)),
)
_SKIP_SUFFIXES = ("_se",)  # standard errors are drawn as bands of their figure, not as lines


def panel_keys(rows: Sequence[Mapping[str, Any]], wanted: Sequence[str]) -> list[str]:
    """The logged keys a panel draws: exact names, and every key under a prefix ending in ``/`` (one level)."""
    logged: dict[str, None] = {}
    for row in rows:
        logged.update({k: None for k in row})
    keys = []
    for want in wanted:
        if want.endswith("/"):
            keys += [
                k for k in logged
                if k.startswith(want) and "/" not in k[len(want):] and not k.endswith(_SKIP_SUFFIXES)
            ]
        elif want in logged:
            keys.append(want)
    return keys


def series(rows: Sequence[Mapping[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the rows where ``key`` is a finite number."""
    steps, values = [], []
    for row in rows:
        value = finite_number(row.get(key))
        if value is not None:
            steps.append(int(row["step"]))
            values.append(value)
    return steps, values


def draw_panels(rows: Sequence[Mapping[str, Any]], alerts: Mapping[str, Sequence[int]]) -> list[tuple[str, bytes]]:
    """One PNG per panel with data: ``[(title, png bytes)]``. Steps with an alert are marked on every panel."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    flagged = sorted({step for steps in alerts.values() for step in steps})
    out = []
    for title, wanted in PANELS:
        keys = panel_keys(rows, wanted)
        if not keys:
            continue
        fig = Figure(figsize=(4.6, 3.0), dpi=100)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        for i, key in enumerate(keys):
            steps, values = series(rows, key)
            marker = "." if len(steps) < 40 else None
            ax.plot(steps, values, color=f"C{i % 10}", label=key, marker=marker, linewidth=1.2)
            _, errors = series(rows, key + "_se")
            if len(errors) == len(values) and errors:
                low = [v - e for v, e in zip(values, errors, strict=True)]
                high = [v + e for v, e in zip(values, errors, strict=True)]
                ax.fill_between(steps, low, high, color=f"C{i % 10}", alpha=0.2, linewidth=0)
        for step in flagged:
            ax.axvline(step, color="red", alpha=0.15, linewidth=2)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("iteration", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if len(keys) > 1 or keys[0] != wanted[0]:
            ax.legend(fontsize=6, loc="best")
        fig.tight_layout()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png")
        out.append((title, buffer.getvalue()))
    return out
