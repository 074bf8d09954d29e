"""Comparisons between the bench's methods: which final differences are significant, and NFE ratios.

- :func:`pairwise`: Welch's t-test on the final held-out figure of every pair of methods (seeds are the
  samples). With 3 to 5 seeds a test has little power: a non-significant difference is "not shown", not
  "equal".
- :func:`reach_ratios`: for every pair (method M, level-setter R), the NFE at which M's mean curve first
  reaches R's final mean, divided by the NFE R itself needed (its mean curve's first crossing of its own
  final mean). Below 1: M gets there with fewer rollout evaluations. The interval is a percentile bootstrap
  that resamples each method's seeds; resamples where a level is never reached, or where R starts at or
  above its own final mean (needs 0 NFE, so no ratio), are counted as ``undefined``.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

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


def _ratio(curves_m: Sequence[Mapping[str, Any]], curves_r: Sequence[Mapping[str, Any]]) -> float | None:
    """NFE for M's mean curve to reach R's final mean / NFE for R's own mean curve to reach it."""
    from flowrl.bench.report import mean_curve, x_to_reach

    target = statistics.fmean(c["score"][-1] for c in curves_r)
    own = x_to_reach(mean_curve([(c["nfe"], c["score"]) for c in curves_r]), target)
    reach = x_to_reach(mean_curve([(c["nfe"], c["score"]) for c in curves_m]), target)
    if own is None or own <= 0 or reach is None:
        return None
    return reach / own


def reach_ratios(methods: Mapping[str, Mapping[str, Any]], resamples: int = 2000,
                 seed: int = 0) -> dict[str, dict[str, Any]]:
    """``{R: {M: {"ratio", "low", "high", "undefined"}}}`` for every ordered pair M != R (see the module doc)."""
    curves = {name: [s["curve"] for s in m["seeds"].values()] for name, m in methods.items()}
    out: dict[str, dict[str, Any]] = {}
    for r, m in itertools.permutations(methods, 2):
        interval = bootstrap({"m": curves[m], "r": curves[r]}, lambda d: _ratio(d["m"], d["r"]), resamples, seed)
        out.setdefault(r, {})[m] = {"ratio": _ratio(curves[m], curves[r]), **interval}
    return out
