"""The statistics of a suite table: a column's headline figure with its 95% interval, and the paired difference of
two columns on the prompts they share, with its 95% interval and two-sided p-value.

Prompts are the sampling unit (a prompt's images are averaged first). A headline is either the mean over prompts
or, where the suite's source defines it so (GenEval's "overall"), the mean over categories of each category's
mean over prompts. Both are linear in the per-prompt values; the standard error of the second is the stratified
one, ``SE^2 = sum_k s_k^2 / (K^2 n_k)``, with Welch-Satterthwaite degrees of freedom.

Intervals:

- a figure whose every image scored 0 or 1 (a proportion: strict accuracy, GenEval's correct) gets a Wilson score
  interval, which stays inside [0, 1] and is never of width 0. Its n is the effective sample size of the
  clustered design, ``p(1 - p) / SE^2`` (Kish), capped at the number of images: images of one prompt are not
  independent, so the interval is as wide as the prompt-level spread says;
- any other figure gets the t interval, ``mean +- t(0.975, df) SE``;
- a paired difference gets the t interval of the per-prompt differences, and the p-value of the paired t-test
  (for a plain mean: SciPy's ``ttest_rel``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

Z95 = 1.959963984540054  # the standard normal's 0.975 quantile


def t_quantile(p: float, df: float) -> float:
    """The t value with two-sided tail probability ``p`` (bisection on Student's t tail of flowrl.bench.stats)."""
    from flowrl.bench.stats import t_two_sided_p  # here: the run report reads these tables without the bench

    if math.isinf(df):
        df = 1e9
    low, high = 0.0, 1e6
    for _ in range(200):
        mid = (low + high) / 2
        if t_two_sided_p(mid, df) > p:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def estimate(values: Sequence[float], strata: Sequence[str] | None = None) -> tuple[float, float, float]:
    """The headline of per-prompt ``values`` and its standard error and degrees of freedom: the mean over prompts
    (``strata`` None), or the mean over strata of each stratum's mean. NaN where the spread cannot be estimated
    (fewer than two values in the mean, or in any stratum)."""
    if strata is None:
        n = len(values)
        mean = statistics.fmean(values) if n else math.nan
        if n < 2:
            return mean, math.nan, math.nan
        return mean, statistics.stdev(values) / math.sqrt(n), float(n - 1)
    groups: dict[str, list[float]] = {}
    for value, stratum in zip(values, strata, strict=True):
        groups.setdefault(stratum, []).append(value)
    if not groups:
        return math.nan, math.nan, math.nan
    k = len(groups)
    mean = sum(statistics.fmean(g) for g in groups.values()) / k
    if any(len(g) < 2 for g in groups.values()):
        return mean, math.nan, math.nan
    parts = [statistics.variance(g) / (k * k * len(g)) for g in groups.values()]
    variance = sum(parts)
    if variance == 0:
        return mean, 0.0, float(sum(len(g) - 1 for g in groups.values()))
    df = variance**2 / sum(a * a / (len(g) - 1) for a, g in zip(parts, groups.values(), strict=True))
    return mean, math.sqrt(variance), df


def wilson(p: float, n: float) -> tuple[float, float]:
    """The 95% Wilson score interval of a proportion ``p`` observed on ``n`` (possibly effective) trials."""
    if not (math.isfinite(p) and n > 0):
        return math.nan, math.nan
    z2 = Z95 * Z95
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def interval(values: Sequence[float], strata: Sequence[str] | None, proportion: bool,
             images: int) -> dict[str, Any]:
    """A column's headline with its standard error and 95% interval ``[low, high]`` (``images``: how many images
    its prompts hold, the cap of a proportion's effective n)."""
    mean, se, df = estimate(values, strata)
    if proportion and math.isfinite(mean):
        n_eff = images if not math.isfinite(se) or se == 0 else min(images, mean * (1 - mean) / (se * se))
        low, high = wilson(mean, max(n_eff, 1.0)) if images else (math.nan, math.nan)
        return {"mean": mean, "se": se, "low": low, "high": high, "method": "wilson", "n_eff": n_eff}
    half = t_quantile(0.05, df) * se if math.isfinite(se) and math.isfinite(df) and df > 0 else math.nan
    return {"mean": mean, "se": se, "low": mean - half, "high": mean + half, "method": "t"}


def paired(a: Sequence[float], b: Sequence[float], strata: Sequence[str] | None = None) -> dict[str, float]:
    """``b - a`` prompt by prompt: the headline of the differences, its 95% interval ``[low, high]`` (and
    half-width), t and the two-sided p-value."""
    from flowrl.bench.stats import t_two_sided_p

    diffs = [y - x for x, y in zip(a, b, strict=True)]
    n = len(diffs)
    mean, se, df = estimate(diffs, strata)
    if not math.isfinite(se):
        t, p, half = math.nan, math.nan, math.nan
    elif se == 0:  # every difference equal: none (p = 1), or the same shift for every prompt
        t = math.nan if mean == 0 else math.copysign(math.inf, mean)
        p, half = (1.0 if mean == 0 else 0.0), 0.0
    else:
        t = mean / se
        p, half = t_two_sided_p(t, df), t_quantile(0.05, df) * se
    return {"diff": mean, "half_width": half, "low": mean - half, "high": mean + half, "t": t, "p": p, "n": n,
            "df": df}
