"""Mean curves over seeds, and the x at which a curve reaches a level.

A curve is a metric at each evaluation against an x (cumulative rollout NFE or training wall time). A
method's mean curve is taken on the union of its seeds' x values, each seed interpolated linearly between
its evaluations and held at its first / last value outside them.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from flowrl.bench.stats import standard_error

_TOLERANCE = 1e-12


def interp(x: float, xs: Sequence[float], ys: Sequence[float]) -> float:
    """Piecewise-linear ``y(x)``, held at the end values outside ``[xs[0], xs[-1]]``."""
    if x <= xs[0]:
        return ys[0]
    for i in range(1, len(xs)):
        if x <= xs[i]:
            x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
            return y1 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return ys[-1]


def stats(values: Sequence[float]) -> dict[str, Any]:
    """n, mean, sample standard deviation and standard error (``None`` below two values), min and max."""
    return {
        "n": len(values),
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else None,
        "se": standard_error(values),
        "min": min(values),
        "max": max(values),
    }


def mean_curve(curves: Sequence[tuple[Sequence[float], Sequence[float]]]) -> dict[str, list[Any]]:
    """Mean, std, min and max over seeds on the union of the seeds' x values."""
    grid = sorted({x for xs, _ in curves for x in xs})
    out: dict[str, list[Any]] = {"x": grid, "mean": [], "std": [], "min": [], "max": []}
    for x in grid:
        s = stats([interp(x, xs, ys) for xs, ys in curves])
        for key in ("mean", "std", "min", "max"):
            out[key].append(s[key])
    return out


def mean_only_curve(curves: Sequence[tuple[Sequence[float], Sequence[float]]]) -> dict[str, list[Any]]:
    """The mean of :func:`mean_curve` alone (the same numbers), for the bootstraps that need only it: the
    standard deviation at every point (``statistics.stdev`` works in exact fractions) made a merged report of
    nine methods take over 25 minutes."""
    grid = sorted({x for xs, _ in curves for x in xs})
    return {"x": grid, "mean": [statistics.fmean([interp(x, xs, ys) for xs, ys in curves]) for x in grid]}


def x_to_reach(curve: Mapping[str, Sequence[float]], target: float) -> float | None:
    """First x where the mean curve reaches ``target`` (linear between points); ``None`` if it never does."""
    xs, ys = curve["x"], curve["mean"]
    tol = _TOLERANCE * max(1.0, abs(target))
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        if y >= target - tol:
            if i == 0 or y <= ys[i - 1]:
                return float(x)
            x0, y0 = xs[i - 1], ys[i - 1]
            return float(min(x, x0 + (x - x0) * (target - y0) / (y - y0)))
    return None
