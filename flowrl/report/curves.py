"""The curves of a run report: one panel per group of related metrics, drawn from ``metrics.jsonl``.

Each panel has its quantity and unit on the y axis and can be drawn against three x axes (iterations, rollout
NFE, training seconds). A panel whose figures never move (a clip fraction of 0 with one inner epoch, a loss
that is float noise at 1e-8) is not drawn: it is listed as flat, with the value it held. With a single reward,
``reward/<name>`` equals ``reward/total`` and is drawn once. A figure with a standard error (``<key>_se``) is
drawn with its band, and no y range is narrower than the noise it shows (four standard errors, or 2% of the
figure's size), so a wobble inside the noise reads as noise (the world's per-category strict accuracy has one). The
training reward, noisy from one iteration to the next, is drawn faint with its running mean over :data:`SMOOTH`
iterations. Legends name figures ("strict accuracy", a category, a reward), not raw keys. Fewer than
:data:`LINE_FROM` points are drawn as points, not joined by lines.

Drawn with matplotlib's Agg canvas only (no pyplot state): PNG bytes for the page, and PNG and PDF files at
print resolution (:func:`export_panels`).
"""

from __future__ import annotations

import io
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from flowrl.utils.finite import finite_number


@attrs.frozen
class PanelSpec:
    """A panel: its title, the metric keys it draws (a key ending in ``/`` takes every key one level under it),
    the y axis label, and the size below which its values are float noise (0: any movement counts)."""

    title: str
    keys: tuple[str, ...]
    ylabel: str
    noise: float = 0.0
    counters: bool = False  # drawn against iterations only (a cumulative counter against itself says nothing)


PANELS: tuple[PanelSpec, ...] = (
    PanelSpec("training reward", ("reward/",), "reward (mean over the iteration's rollouts)"),
    PanelSpec("held-out evaluation", ("eval/score", "eval/strict"), "held-out figure (mean ± se)"),
    PanelSpec("held-out strict accuracy by category", ("eval/strict/",), "strict accuracy (mean ± se)"),
    PanelSpec("KL to the initial policy", ("health/kl_initial",), "KL per latent dimension (nats)"),
    PanelSpec("velocity drift from the initial policy", ("health/velocity_drift",), "rms(v - v0) / rms(v0)"),
    PanelSpec("within-group diversity", ("health/diversity",), "rms pixel distance within a group"),
    PanelSpec("groups without reward spread", ("health/zero_spread",), "share of groups"),
    PanelSpec("clip fraction", ("clip_frac",), "share of clipped ratios"),
    PanelSpec("loss", ("loss",), "loss (mean over trained transitions)", noise=1e-6),
    PanelSpec("gradient norm", ("grad_norm",), "global L2 norm, before clipping"),
    PanelSpec("rollout NFE (cumulative)", ("nfe",), "transformer evaluations", counters=True),
    PanelSpec("training wall time", ("wall_s",), "seconds (evaluations excluded)", counters=True),
)
NAMES = {"eval/score": "score (partial credit)", "eval/strict": "strict accuracy", "reward/total": "total reward"}
SMOOTH = 10  # the running mean of the training reward: the mean of the last this many logged iterations
AXES: tuple[tuple[str, str], ...] = (("step", "iteration"), ("nfe", "rollout NFE"), ("wall_s", "training seconds"))
LINE_FROM = 5  # fewer points than this are drawn as points only
_SKIP_SUFFIXES = ("_se",)  # standard errors are drawn as bands of their figure, not as lines


@attrs.frozen
class Panel:
    """A panel with data: the keys it draws (an identical reward copy dropped), or why it is flat."""

    spec: PanelSpec
    keys: tuple[str, ...]
    flat: str = ""  # non-empty: the panel is not drawn, and this says what it held

    @property
    def slug(self) -> str:
        return re.sub(r"[^a-z0-9]+", "_", self.spec.title.lower()).strip("_")


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


def series(rows: Sequence[Mapping[str, Any]], key: str, x: str = "step") -> tuple[list[float], list[float]]:
    """(x values, values) of the rows where ``key`` is a finite number (x: ``step``, ``nfe`` or ``wall_s``)."""
    xs, values = [], []
    for row in rows:
        value, at = finite_number(row.get(key)), finite_number(row.get(x))
        if value is not None and at is not None:
            xs.append(int(at) if x == "step" else at)
            values.append(value)
    return xs, values


def _single_reward(rows: Sequence[Mapping[str, Any]], keys: list[str]) -> list[str]:
    """``reward/total`` alone where the one other reward key equals it at every row."""
    if "reward/total" not in keys or len(keys) != 2:
        return keys
    other = next(k for k in keys if k != "reward/total")
    same = series(rows, other) == series(rows, "reward/total")
    return ["reward/total"] if same else keys


def _flat(rows: Sequence[Mapping[str, Any]], keys: Sequence[str], noise: float) -> str:
    """What a panel held, when none of its figures moves: "" when any does."""
    held = []
    for key in keys:
        values = series(rows, key)[1]
        if not values:
            continue
        low, high = min(values), max(values)
        if noise and max(abs(low), abs(high)) < noise:
            held.append(f"{key}: |value| < {noise:g} throughout (float noise)")
        elif high - low <= 1e-9 + 1e-6 * max(abs(low), abs(high)):
            held.append(f"{key}: {low:.6g} at every logged iteration")
        else:
            return ""
    return "; ".join(held) or "no finite value"


def panels(rows: Sequence[Mapping[str, Any]]) -> list[Panel]:
    """Every panel with logged data, flat ones marked."""
    out = []
    for spec in PANELS:
        keys = panel_keys(rows, spec.keys)
        if not keys:
            continue
        if spec.keys == ("reward/",):
            keys = _single_reward(rows, keys)
        out.append(Panel(spec, tuple(keys), _flat(rows, keys, spec.noise)))
    return out


def _y_floor(ax: Any, values: Sequence[float], errors: Sequence[float]) -> None:
    """Widen the y range to at least four standard errors (or 2% of the values' size) around its middle."""
    low, high = ax.get_ylim()
    se = sum(errors) / len(errors) if errors else 0.0
    span = max(4 * se, 0.02 * max((abs(v) for v in values), default=0.0), 1e-12)
    if high - low < span:
        middle = (high + low) / 2
        ax.set_ylim(middle - span / 2, middle + span / 2)


def name_of(key: str, panel: PanelSpec) -> str:
    """A legend's name for ``key``: its own name where flowrl has one, else the part under the panel's prefix."""
    if key in NAMES:
        return NAMES[key]
    prefix = next((k for k in panel.keys if k.endswith("/") and key.startswith(k)), "")
    return key[len(prefix):] if prefix else key


def running_mean(values: Sequence[float], window: int = SMOOTH) -> list[float]:
    """The mean of each value and the ``window - 1`` before it (fewer at the start)."""
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def figure(rows: Sequence[Mapping[str, Any]], panel: Panel, x: str, flagged: Sequence[int], dpi: int = 100) -> Any:
    """The matplotlib figure of ``panel`` against ``x`` (a key of :data:`AXES`); alert iterations marked."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    smooth = panel.spec.keys == ("reward/",)  # a noisy per-iteration figure: its running mean beside it
    entries = len(panel.keys) * (2 if smooth else 1)
    legend_rows = 0 if entries == 1 else -(-entries // 3)
    fig = Figure(figsize=(5.0, 3.3 + 0.22 * legend_rows), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    every_value: list[float] = []
    every_error: list[float] = []
    for i, key in enumerate(panel.keys):
        xs, values = series(rows, key, x)
        if not values:
            continue
        colour = f"C{i % 10}"
        line = "-" if len(values) >= LINE_FROM else "none"
        label = name_of(key, panel.spec)
        ax.plot(xs, values, color=colour, label=label, marker="o" if len(values) < 40 else None, markersize=3,
                linestyle=line, linewidth=1.3 if not smooth else 0.8, alpha=1.0 if not smooth else 0.45)
        if smooth and len(values) >= LINE_FROM:
            ax.plot(xs, running_mean(values), color=colour, linewidth=1.8,
                    label=f"{label}, running mean of {SMOOTH}")
        _, errors = series(rows, key + "_se", x)
        if len(errors) == len(values):
            ax.fill_between(xs, [v - e for v, e in zip(values, errors, strict=True)],
                            [v + e for v, e in zip(values, errors, strict=True)], color=colour, alpha=0.2, linewidth=0)
            every_error += errors
        every_value += values
    if x == "step":
        for step in flagged:
            ax.axvline(step, color="red", alpha=0.15, linewidth=2)
    ax.set_title(panel.spec.title, fontsize=11)
    ax.set_xlabel(dict(AXES)[x], fontsize=9)
    ax.set_ylabel(panel.spec.ylabel, fontsize=9)
    ax.tick_params(labelsize=8)
    if x in ("step", "nfe"):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    _y_floor(ax, every_value, every_error)
    if legend_rows:
        fig.legend(*ax.get_legend_handles_labels(), loc="lower center", ncol=min(3, entries), fontsize=8,
                   frameon=False)
    fig.tight_layout(rect=(0, 0.075 * legend_rows / (1 + 0.07 * legend_rows), 1, 1))
    return fig


def _axes_of(panel: Panel) -> tuple[str, ...]:
    return ("step",) if panel.spec.counters else tuple(a for a, _ in AXES)


def draw_panels(rows: Sequence[Mapping[str, Any]], alerts: Mapping[str, Sequence[int]]
                ) -> list[tuple[Panel, dict[str, bytes]]]:
    """Each drawn (not flat) panel with its PNG per x axis: ``[(panel, {axis: png bytes})]``."""
    flagged = sorted({step for steps in alerts.values() for step in steps})
    out = []
    for panel in panels(rows):
        if panel.flat:
            continue
        images = {}
        for x in _axes_of(panel):
            buffer = io.BytesIO()
            figure(rows, panel, x, flagged).savefig(buffer, format="png")
            images[x] = buffer.getvalue()
        out.append((panel, images))
    return out


def export_panels(rows: Sequence[Mapping[str, Any]], alerts: Mapping[str, Sequence[int]], folder: Path,
                  dpi: int = 300) -> list[Path]:
    """Every drawn panel against each of its x axes as ``<panel>_<axis>.png`` (``dpi``) and ``.pdf`` in
    ``folder``; returns the files written."""
    flagged = sorted({step for steps in alerts.values() for step in steps})
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for panel in panels(rows):
        if panel.flat:
            continue
        for x in _axes_of(panel):
            fig = figure(rows, panel, x, flagged, dpi=dpi)
            for suffix in (".png", ".pdf"):
                path = folder / f"{panel.slug}_{x}{suffix}"
                fig.savefig(path, format=suffix[1:])
                written.append(path)
    return written
