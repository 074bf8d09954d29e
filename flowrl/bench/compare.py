"""Comparisons between the bench's methods: which final differences are significant, and NFE ratios.

- :func:`pairwise`: Welch's t-test on the final held-out figure of every pair of methods (seeds are the
  samples). With 3 to 5 seeds a test has little power: a non-significant difference is "not shown", not
  "equal".
- :func:`reach_ratios`: for every pair (method M, level-setter R), the NFE at which M's mean curve first
  reaches R's final mean, divided by the NFE R itself needed (its mean curve's first crossing of its own
  final mean). Below 1: M gets there with fewer rollout evaluations. The interval is a percentile bootstrap
  that resamples each method's seeds; resamples where a level is never reached, or where R starts at or
  above its own final mean (needs 0 NFE, so no ratio), are counted as ``undefined``.
- :func:`reach_levels`: the NFE each method needs to rise a fixed amount above the common starting score,
  with a seed-bootstrap interval: the form that stays defined when a method does not improve.
"""

from __future__ import annotations

import functools
import itertools
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from flowrl.bench.curve import mean_only_curve, x_to_reach
from flowrl.bench.stats import bootstrap, welch

SIGNIFICANCE = 0.05  # two-sided level at which a pairwise difference is flagged


def _finals(method: Mapping[str, Any]) -> list[float]:
    return [seed["final"]["score"] for seed in method["seeds"].values()]


def pairwise(methods: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Welch's test of every pair's final mean (first named minus second); pairs with fewer than two seeds
    on a side get ``p = None``."""
    out = []
    for a, b in itertools.combinations(methods, 2):
        fa, fb = _finals(methods[a]), _finals(methods[b])
        row: dict[str, Any] = {"a": a, "b": b, "diff": statistics.fmean(fa) - statistics.fmean(fb)}
        if len(fa) > 1 and len(fb) > 1:
            row.update(welch(fa, fb))
        else:
            row.update(se=None, t=None, df=None, p=None)
        row["significant"] = row["p"] is not None and row["p"] < SIGNIFICANCE
        out.append(row)
    return out


AXES = ("step", "nfe", "wall_s", "rows")  # what a reach can be counted in: optimizer steps (one per iteration),
# rollout NFE, training seconds, total transformer rows (rollouts plus the update's forwards and backwards)


def _reach(curves: Sequence[Mapping[str, Any]], level: float, axis: str = "nfe") -> float | None:
    """The ``axis`` value at which the mean curve of ``curves`` first reaches ``level`` (``None``: never)."""
    return x_to_reach(mean_only_curve([(c[axis], c["score"]) for c in curves]), level)


def _own(curves_r: Sequence[Mapping[str, Any]], axis: str = "nfe") -> float | None:
    return _reach(curves_r, statistics.fmean(c["score"][-1] for c in curves_r), axis)


def _ratio(curves_m: Sequence[Mapping[str, Any]], curves_r: Sequence[Mapping[str, Any]],
           axis: str = "nfe") -> float | None:
    """``axis`` for M's mean curve to reach R's final mean / the same for R's own mean curve."""
    own = _own(curves_r, axis)
    reach = _reach(curves_m, statistics.fmean(c["score"][-1] for c in curves_r), axis)
    if own is None or own <= 0 or reach is None:
        return None
    return reach / own


def has_axis(methods: Mapping[str, Mapping[str, Any]], axis: str) -> bool:
    """Every seed's curve of every method has ``axis`` (runs before the ``rows`` counter lack it)."""
    return all(axis in s["curve"] for m in methods.values() for s in m["seeds"].values())


def reach_ratios(methods: Mapping[str, Mapping[str, Any]], resamples: int = 2000,
                 seed: int = 0, axis: str = "nfe") -> dict[str, dict[str, Any]]:
    """``{R: {M: {"ratio", "low", "high", "undefined", "why"}}}`` for every ordered pair M != R, counted in
    ``axis`` (see the module doc); ``why`` says why a ratio is missing: ``"not reached"``, or ``"no gain"``
    when R's own mean curve is at its final level from the start (R did not improve, so "R's NFE" is 0)."""
    curves = {name: [s["curve"] for s in m["seeds"].values()] for name, m in methods.items()}
    out: dict[str, dict[str, Any]] = {}
    for r, m in itertools.permutations(methods, 2):
        interval = bootstrap({"m": curves[m], "r": curves[r]}, lambda d: _ratio(d["m"], d["r"], axis), resamples,
                             seed)
        ratio = _ratio(curves[m], curves[r], axis)
        own = _own(curves[r], axis)
        why = "" if ratio is not None else ("no gain" if own is not None and own <= 0 else "not reached")
        out.setdefault(r, {})[m] = {"ratio": ratio, "why": why, **interval}
    return out


def _reach_drawn(drawn: Mapping[str, Sequence[Mapping[str, Any]]], level: float) -> float | None:
    return _reach(drawn["m"], level)


def reach_levels(methods: Mapping[str, Mapping[str, Any]], gains: Sequence[float] = (0.02, 0.04, 0.06, 0.08),
                 resamples: int = 2000, seed: int = 0) -> dict[str, Any]:
    """NFE each method's mean curve needs to rise ``gain`` above the common start (the mean first evaluation
    of every run: all methods start from one base model), with a seed-bootstrap interval:
    ``{"start", "levels", "methods": {M: [{"gain", "level", "nfe", "low", "high", "undefined"}]}}``."""
    curves = {name: [s["curve"] for s in m["seeds"].values()] for name, m in methods.items()}
    start = statistics.fmean(c["score"][0] for cs in curves.values() for c in cs)
    table: dict[str, list[dict[str, Any]]] = {}
    for name, cs in curves.items():
        rows = []
        for gain in gains:
            level = start + gain
            interval = bootstrap({"m": cs}, functools.partial(_reach_drawn, level=level), resamples, seed)
            rows.append({"gain": gain, "level": level, "nfe": _reach(cs, level), **interval})
        table[name] = rows
    return {"start": start, "levels": [start + g for g in gains], "methods": table}
