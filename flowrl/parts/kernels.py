"""Transition kernels: the Gaussian of one denoising step ``x_s -> x_{s_next}`` (docs/algorithms.md, kernels).

Every kernel returns the mean (fp32, shaped like ``x``) and the std (fp32, shape ``(B,)``). The per-row
coefficients are formed in float64 from ``s`` and ``s_next`` and applied to the fp32 latents. A merged
jump (``s_next`` several grid steps below ``s``) uses the same formulas with the larger ``dt``.
"""

from __future__ import annotations

import math
from typing import Literal

import attrs
import torch
from torch import Tensor

from flowrl.core.choices import one_of
from flowrl.core.interfaces import TransitionKernel, gaussian_log_prob
from flowrl.core.registry import register

MeanStd = tuple[Tensor, Tensor]
LogProb = Literal["gaussian", "official"]  # CPSKernel's log_prob setting


def _col(coef: Tensor, like: Tensor) -> Tensor:
    """A ``(B,)`` coefficient as fp32, shaped to broadcast over ``like``'s latent dimensions."""
    return coef.to(torch.float32).reshape(coef.shape + (1,) * (like.dim() - 1))


def _levels(s: Tensor, s_next: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    s64, n64 = s.to(torch.float64), s_next.to(torch.float64)
    return s64, n64, n64 - s64


@register("kernel", "flow_grpo_sde")
class FlowGRPOKernel(TransitionKernel):
    """Flow-GRPO SDE step, sigma_t = a sqrt(s / (1 - s)) (arXiv 2505.05470, Eq. 9; docs/algorithms.md).

    ``mean = x (1 + sigma_t^2 dt / (2 s)) + v (1 + sigma_t^2 (1 - s) / (2 s)) dt``,
    ``std = sigma_t sqrt(-dt)``; at ``s = 1`` the denominator uses the grid's second level ``s_at_one``.
    """

    @attrs.frozen
    class Config:
        noise_level: float = attrs.field(default=0.7, validator=attrs.validators.ge(0))  # a

    def sigma_t(self, s: Tensor, s_at_one: float) -> Tensor:
        """``a sqrt(s / (1 - s'))`` with ``s' = s_at_one`` where ``s == 1`` (float64)."""
        s64 = s.to(torch.float64)
        guarded = torch.where(s64 == 1.0, torch.full_like(s64, s_at_one), s64)
        return self.config.noise_level * torch.sqrt(s64 / (1.0 - guarded))

    def mean_std(self, x: Tensor, v: Tensor, s: Tensor, s_next: Tensor, s_at_one: float) -> MeanStd:
        x, v = x.float(), v.float()
        s64, _, dt = _levels(s, s_next)
        sig2 = self.sigma_t(s, s_at_one) ** 2
        cx = 1.0 + sig2 * dt / (2.0 * s64)
        cv = (1.0 + sig2 * (1.0 - s64) / (2.0 * s64)) * dt
        std = torch.sqrt(sig2) * torch.sqrt((-dt).clamp(min=0.0))
        return _col(cx, x) * x + _col(cv, x) * v, std.float()


@register("kernel", "dance_grpo_sde")
class DanceGRPOKernel(TransitionKernel):
    """DanceGRPO SDE step with constant eta (arXiv 2505.07818; docs/algorithms.md).

    ``std = eta sqrt(s - s_next)``, ``mean = x + v dt - 0.5 eta^2 score dt`` with
    ``score = -(x - (1 - s) x0_hat) / s^2`` and ``x0_hat = x - s v``.
    """

    @attrs.frozen
    class Config:
        eta: float = attrs.field(default=0.3, validator=attrs.validators.ge(0))

    def mean_std(self, x: Tensor, v: Tensor, s: Tensor, s_next: Tensor, s_at_one: float) -> MeanStd:
        x, v = x.float(), v.float()
        s64, _, dt = _levels(s, s_next)
        eta = self.config.eta
        # score = -(x - (1 - s)(x - s v)) / s^2 = -(s x + s (1 - s) v) / s^2 = -(x + (1 - s) v) / s
        x0_hat = x - _col(s64, x) * v
        score = -(x - _col(1.0 - s64, x) * x0_hat) / _col(s64**2, x)
        mean = x + _col(dt, x) * v - _col(0.5 * eta**2 * dt, x) * score
        std = eta * torch.sqrt((-dt).clamp(min=0.0))
        return mean, std.float()


@register("kernel", "cps")
class CPSKernel(TransitionKernel):
    """Coefficient-preserving sampling step (CPS): std = s_next sin(a pi / 2).

    ``mean = (1 - s_next) x0_hat + sqrt(s_next^2 - std^2) eps_hat`` with ``x0_hat = x - s v`` and
    ``eps_hat = x + (1 - s) v``; the step to ``s_next = 0`` has std 0 and lands on ``x0_hat``.

    ``log_prob = "gaussian"`` (default) gives the ratios the true density of this Gaussian,
    ``-(x - mean)^2 / (2 std^2) - log std - log(2 pi) / 2`` averaged over dimensions. ``"official"`` is the
    form of the CPS authors' released code, ``-(x - mean)^2`` averaged over dimensions: no ``1 / (2 std^2)``,
    so the Gaussian log-ratio is ``1 / (2 std^2)`` times the official one (at a = 0.7 on the 10-step grid
    with shift 3: 0.68x at the first step to 10x at the last stochastic one), and a clip range tuned with
    that code transfers only with this form. Both forms give the same sampler; only the ratios differ.
    """

    @attrs.frozen
    class Config:
        noise_level: float = attrs.field(
            default=0.7, validator=[attrs.validators.ge(0), attrs.validators.le(1)]
        )  # a in [0, 1]
        log_prob: LogProb = attrs.field(default="gaussian", validator=one_of(LogProb))

    def log_prob(self, x: Tensor, mean: Tensor, std: Tensor) -> Tensor:
        if self.config.log_prob == "gaussian":
            return gaussian_log_prob(x, mean, std)
        x, mean = x.float(), mean.float()
        per_dim = -((x - mean) ** 2)
        point = std.float().reshape(std.shape + (1,) * (mean.dim() - 1)) <= 0  # std 0: a point mass, never trained
        per_dim = torch.where(point, torch.full_like(per_dim, math.inf), per_dim)
        return per_dim.flatten(1).mean(1)

    def mean_std(self, x: Tensor, v: Tensor, s: Tensor, s_next: Tensor, s_at_one: float) -> MeanStd:
        x, v = x.float(), v.float()
        s64, n64, _ = _levels(s, s_next)
        std = n64 * math.sin(self.config.noise_level * math.pi / 2)
        c_eps = torch.sqrt((n64**2 - std**2).clamp(min=0.0))
        x0_hat = x - _col(s64, x) * v
        eps_hat = x + _col(1.0 - s64, x) * v
        return _col(1.0 - n64, x) * x0_hat + _col(c_eps, x) * eps_hat, std.float()


@register("kernel", "ode")
class ODEKernel(TransitionKernel):
    """Deterministic Euler step x' = x + v dt (std 0: no log-density, never trained)."""

    @attrs.frozen
    class Config:
        pass

    def mean_std(self, x: Tensor, v: Tensor, s: Tensor, s_next: Tensor, s_at_one: float) -> MeanStd:
        x, v = x.float(), v.float()
        dt = _levels(s, s_next)[2]
        return x + _col(dt, x) * v, torch.zeros(x.shape[0], dtype=torch.float32, device=x.device)
