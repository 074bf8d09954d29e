"""Small-sample statistics for the bench report: standard errors, Welch's t-test and seed bootstraps.

Pure Python (no SciPy): the two-sided p-value of Student's t comes from the regularised incomplete beta
function, ``P(|T| > t) = I_x(df / 2, 1 / 2)`` with ``x = df / (df + t^2)``, evaluated by its continued
fraction (modified Lentz). Seeds are few (3 to 5), so every figure here is meant to be read with its
sample size: Welch's test does not assume equal variances, and the bootstrap intervals resample seeds.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Sequence
from typing import Any

_EPS = 1e-15
_TINY = 1e-300


def standard_error(values: Sequence[float]) -> float | None:
    """Sample standard deviation / sqrt(n); ``None`` below two values."""
    return statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of I_x(a, b) (converges fast for x < (a + 1) / (a + b + 2))."""
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    result = d
    for m in range(1, 500):
        # even step: m (b - m) x / ((a + 2m - 1)(a + 2m)); odd step: -(a + m)(a + b + m) x / ((a + 2m)(a + 2m + 1))
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + numerator / c
            c = c if abs(c) > _TINY else _TINY
            result *= c * d
        if abs(c * d - 1.0) < _EPS:
            break
    return result


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b) for a, b > 0 and 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, 1.0 - x) / b  # symmetry I_x(a,b) = 1 - I_{1-x}(b,a)


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with ``df`` degrees of freedom."""
    if not math.isfinite(t):
        return 0.0
    return incomplete_beta(df / 2.0, 0.5, df / (df + t * t))


def welch(a: Sequence[float], b: Sequence[float]) -> dict[str, Any]:
    """Welch's unequal-variance t-test of mean(a) - mean(b): diff, se, t, df (Welch-Satterthwaite), p.

    Needs two values on each side; ``t``, ``df`` and ``p`` are ``None`` when both samples have zero variance
    (nothing to test against)."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError("Welch's t-test needs at least two values per group")
    diff = statistics.fmean(a) - statistics.fmean(b)
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(va + vb)
    out: dict[str, Any] = {"diff": diff, "se": se, "t": None, "df": None, "p": None}
    if se == 0.0:
        return out
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    t = diff / se
    out.update(t=t, df=df, p=t_two_sided_p(t, df))
    return out


def bootstrap(groups: dict[str, Sequence[Any]], statistic: Callable[[dict[str, list[Any]]], float | None],
              resamples: int = 2000, seed: int = 0, level: float = 0.95) -> dict[str, Any]:
    """Percentile interval of ``statistic`` over resamples that draw each group's items with replacement.

    ``statistic`` may return ``None`` (e.g. a level never reached); those resamples count in ``undefined``
    (their share) and the interval is taken over the rest. Returns ``{"low", "high", "undefined",
    "resamples", "level"}``; ``low`` / ``high`` are ``None`` if no resample is defined."""
    rng = random.Random(seed)
    values = []
    for _ in range(resamples):
        drawn = {name: [items[rng.randrange(len(items))] for _ in items] for name, items in groups.items()}
        value = statistic(drawn)
        if value is not None and math.isfinite(value):
            values.append(value)
    out: dict[str, Any] = {"low": None, "high": None, "undefined": 1 - len(values) / resamples,
                           "resamples": resamples, "level": level}
    if values:
        values.sort()
        tail = (1 - level) / 2
        out["low"] = values[min(len(values) - 1, int(tail * len(values)))]
        out["high"] = values[max(0, math.ceil((1 - tail) * len(values)) - 1)]
    return out
