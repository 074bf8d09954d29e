"""The bench's small-sample statistics against closed forms (Student's t with 1 and 2 degrees of freedom)."""

from __future__ import annotations

import math

import pytest

from flowrl.bench.stats import bootstrap, incomplete_beta, standard_error, t_two_sided_p, welch


@pytest.mark.parametrize("t", [0.0, 0.1, 0.5, 1.0, 2.0, 5.0, 30.0, -2.0])
def test_t_tail_matches_closed_forms(t: float) -> None:
    # 1 df: the Cauchy distribution, P(|T| > t) = 1 - 2 atan|t| / pi. 2 df: P(|T| > t) = 1 - |t| / sqrt(2 + t^2).
    assert t_two_sided_p(t, 1) == pytest.approx(1 - 2 * math.atan(abs(t)) / math.pi, rel=1e-9, abs=1e-12)
    assert t_two_sided_p(t, 2) == pytest.approx(1 - abs(t) / math.sqrt(2 + t * t), rel=1e-9, abs=1e-12)


def test_t_tail_approaches_the_normal_for_many_degrees_of_freedom() -> None:
    normal_tail = math.erfc(1.959963984540054 / math.sqrt(2))  # 0.05
    assert t_two_sided_p(1.959963984540054, 1e7) == pytest.approx(normal_tail, rel=1e-5)


def test_incomplete_beta_symmetry_and_a_polynomial_case() -> None:
    # I_x(2, 1) = x^2 and I_x(a, b) = 1 - I_{1-x}(b, a).
    for x in (0.01, 0.3, 0.7, 0.99):
        assert incomplete_beta(2, 1, x) == pytest.approx(x * x, rel=1e-10)
        assert incomplete_beta(2.5, 0.5, x) == pytest.approx(1 - incomplete_beta(0.5, 2.5, 1 - x), rel=1e-9, abs=1e-12)
    assert incomplete_beta(3, 4, 0.0) == 0.0 and incomplete_beta(3, 4, 1.0) == 1.0


def test_welch_with_two_values_a_side_has_two_degrees_of_freedom() -> None:
    # Equal variances (1 each per mean) and n = 2: df = (1 + 1)^2 / (1 + 1) = 2, t = -3 / sqrt(2).
    result = welch([0.0, 2.0], [3.0, 5.0])
    t = -3 / math.sqrt(2)
    assert (result["diff"], result["se"], result["t"], result["df"]) == pytest.approx((-3.0, math.sqrt(2), t, 2.0))
    assert result["p"] == pytest.approx(1 - abs(t) / math.sqrt(2 + t * t), rel=1e-9)
    assert welch([1.0, 1.0], [2.0, 2.0])["p"] is None  # no variance anywhere: no test
    with pytest.raises(ValueError, match="two values"):
        welch([1.0], [2.0, 3.0])


def test_standard_error_and_bootstrap_interval() -> None:
    assert standard_error([1.0, 3.0]) == pytest.approx(1.0) and standard_error([1.0]) is None
    # The mean of 3 resampled values from {1, 2, 3} lies in [1, 3]; its 95% interval is inside and around 2.
    interval = bootstrap({"a": [1.0, 2.0, 3.0]}, lambda d: sum(d["a"]) / 3, resamples=4000, seed=1)
    assert 1.0 <= interval["low"] < 2.0 < interval["high"] <= 3.0 and interval["undefined"] == 0
    # A statistic that is undefined in some resamples: those are counted, the interval uses the others.
    half = bootstrap({"a": [0.0, 1.0]}, lambda d: None if d["a"][0] == 0.0 else d["a"][0], resamples=1000)
    assert 0.3 < half["undefined"] < 0.7 and half["low"] == half["high"] == 1.0


@pytest.mark.parametrize("seed", range(5))
def test_the_bootstraps_mean_curve_is_the_reports_mean(seed: int) -> None:
    """The reach bootstraps take the mean curve without its spread: the same grid and the same means, exactly
    (the same fmean over the same interpolated values)."""
    import random

    from flowrl.bench.curve import mean_curve, mean_only_curve

    rng = random.Random(seed)
    curves = []
    for _ in range(rng.randint(1, 8)):
        xs = sorted(rng.uniform(0, 6e4) for _ in range(rng.randint(1, 7)))
        curves.append((xs, [rng.random() for _ in xs]))
    full, fast = mean_curve(curves), mean_only_curve(curves)
    assert fast["x"] == full["x"] and fast["mean"] == full["mean"]
