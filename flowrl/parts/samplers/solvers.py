"""Deterministic ODE solvers for the flow-matching probability-flow ODE ``dx/ds = v(x, s)``.

Notation (docs/algorithms.md, notation): ``x_s = (1 - s) x0 + s eps``, so ``alpha_s = 1 - s`` and ``sigma_s = s``; the
data prediction is ``D = x0_hat = x - s v``. A solver integrates from ``sigmas[0]`` to ``sigmas[-1]`` with
exactly one velocity evaluation per interval (so ``len(sigmas) - 1`` evaluations per row).

**DPM-Solver++ 2M, flow-matching form.** With ``lambda_s = log(alpha_s / sigma_s) = log((1 - s) / s)``
the ODE in data-prediction form has the exact solution (variation of constants)

    x_t = (sigma_t / sigma_s) x_s + sigma_t * integral_{lambda_s}^{lambda_t} exp(lambda) D(lambda) d lambda.

Holding ``D`` constant over the step (``h = lambda_t - lambda_s``) gives the first-order update

    x_t = (t / s) x_s + (1 - t) (1 - exp(-h)) D_s,

and since ``(1 - t)(1 - exp(-h)) = (s - t) / s`` this is exactly the Euler step ``x_s + (t - s) v``.
The two-step multistep method replaces ``D_s`` by a linear extrapolation in ``lambda`` from the previous
data prediction: with ``r = h_prev / h``,

    D_eff = (1 + 1 / (2 r)) D_s - (1 / (2 r)) D_prev,

second-order accurate. The first interval (no history, or a history that starts at ``s = 1`` where
``lambda = -inf``) and the final interval to ``s = 0`` (``lambda = +inf``, where it lands on ``D_eff``)
use the first-order update, as is usual for this solver. Coefficients are formed in float64.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

Velocity = Callable[[Tensor, Tensor], Tensor]  # (x, s as a 0-dim float32 tensor) -> v
SOLVERS = ("euler", "dpm_solver_2m")


def log_snr(s: float) -> float:
    """``lambda_s = log((1 - s) / s)``; ``-inf`` at ``s = 1`` and ``+inf`` at ``s = 0``."""
    if s >= 1.0:
        return -math.inf
    if s <= 0.0:
        return math.inf
    return math.log1p(-s) - math.log(s)


def data_prediction(x: Tensor, v: Tensor, s: Tensor | float) -> Tensor:
    """``x0_hat = x - s v``."""
    return x - s * v


def euler_step(x: Tensor, v: Tensor, s: Tensor, s_next: Tensor) -> Tensor:
    """One Euler step of the probability-flow ODE, ``x' = x + v (s_next - s)``: ``x`` and ``v`` ``(B, *latent)``, the
    noise levels ``s`` and ``s_next`` one per row ``(B,)`` or one for every row (0-d tensors). Every ODE step of
    every sampler is this line, so a rollout's deterministic steps are the same arithmetic everywhere."""
    return x + v * (s_next - s).reshape(-1, *([1] * (x.dim() - 1)))


def euler(velocity: Velocity, x: Tensor, sigmas: Tensor) -> Tensor:
    """Euler steps ``x' = x + v (s_next - s)`` over the grid (the arithmetic of
    :func:`flowrl.parts.samplers.walk.walk`)."""
    x = x.float()
    for k in range(len(sigmas) - 1):
        v = velocity(x, sigmas[k])
        x = euler_step(x, v, sigmas[k], sigmas[k + 1])
    return x


def dpm_solver_2m(velocity: Velocity, x: Tensor, sigmas: Tensor) -> Tensor:
    """DPM-Solver++ 2M in the flow-matching parametrisation (see the module docstring)."""
    x = x.float()
    levels = [float(s) for s in sigmas]
    prev_d: Tensor | None = None
    prev_h = math.nan
    for k in range(len(levels) - 1):
        s, t = levels[k], levels[k + 1]
        d = data_prediction(x, velocity(x, sigmas[k]), sigmas[k])
        h = log_snr(t) - log_snr(s)
        d_eff = d
        if prev_d is not None and math.isfinite(prev_h) and math.isfinite(h) and t > 0.0:
            half_inv_r = h / (2.0 * prev_h)
            d_eff = d + half_inv_r * (d - prev_d)
        # to s = 0 the step lands on the data prediction (sigma_t = 0, alpha_t = 1, exp(-h) = 0)
        x = d_eff if t <= 0.0 else (t / s) * x + ((1.0 - t) * -math.expm1(-h)) * d_eff
        prev_d, prev_h = d, h
    return x


def solve(solver: str, velocity: Velocity, x: Tensor, sigmas: Tensor) -> Tensor:
    """Integrate ``x`` over ``sigmas`` (decreasing, float32) with the named solver."""
    if solver == "euler":
        return euler(velocity, x, sigmas)
    if solver == "dpm_solver_2m":
        return dpm_solver_2m(velocity, x, sigmas)
    raise ValueError(f"unknown ODE solver {solver!r}; one of {', '.join(SOLVERS)}")


def coarse_grid(num_steps: int, start: int, steps: int) -> list[int]:
    """Grid indices from ``start`` to ``num_steps`` in (at most) ``steps`` intervals, evenly spaced in index.

    ``steps = 0`` (or at least the remaining count) keeps every grid step. The result starts at ``start``
    and ends at ``num_steps``; it stays on the sampler's own grid, so it works with any backbone schedule.
    """
    remaining = num_steps - start
    if remaining <= 0:
        return [num_steps]
    if steps <= 0 or steps >= remaining:
        return list(range(start, num_steps + 1))
    picks = torch.linspace(start, num_steps, steps + 1, dtype=torch.float64).round().long().tolist()
    return sorted(set(int(i) for i in picks))
