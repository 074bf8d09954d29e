"""Flash-GRPO's SDE step: the Flow-GRPO family's marginal-preserving step with a noise linear in the level."""

from __future__ import annotations

from collections.abc import Iterable

import attrs
import torch
from attrs.validators import ge, optional
from torch import Tensor

from flowrl import register
from flowrl.parts.kernels import FlowGRPOKernel


@register("kernel", "flash_sde")
class FlashSDEKernel(FlowGRPOKernel):
    """Flash-GRPO SDE step, diffusion ``g(s) = s_min + (s_max - s_min) s`` (arXiv 2605.15980; docs/algorithms.md).

    ``mean = x (1 + g^2 dt / (2 s)) + v (1 + g^2 (1 - s) / (2 s)) dt``, ``std = g sqrt(-dt)``.

    Derivation, the same as ``flow_grpo_sde``'s. On the path ``x_s = (1 - s) x0 + s eps`` the velocity ``v``
    estimates ``eps - x0``, so ``eps_hat = x + (1 - s) v`` and the score is ``-eps_hat / s``. For any diffusion
    ``g(s)`` the reverse-time SDE ``dx = [v + g^2 eps_hat / (2 s)] ds + g dW`` keeps the ODE's marginals; one
    Euler-Maruyama step of size ``dt = s_next - s < 0`` is the Gaussian above (expand ``eps_hat``: the ``x``
    coefficient gains ``g^2 dt / (2 s)``, the ``v`` coefficient ``g^2 (1 - s) dt / (2 s)``). Flow-GRPO takes
    ``g = a sqrt(s / (1 - s))``, which needs a guard at ``s = 1``; Flash-GRPO's ``g`` is linear in ``s`` and
    finite everywhere, so no guard is needed (``s > 0`` at every step a sampler takes stochastically).

    ``s_max`` unset is the grid's second level ``s_1`` (``schedule.s_at_one``) and ``s_min = 0`` the last, as
    the authors' Wan sampler sets them; the diffusion is then about ``s_1 s``, close to ``s``.
    """

    @attrs.frozen
    class Config:
        s_max: float | None = attrs.field(default=None, validator=optional(ge(0)))  # None: the grid's s_1
        s_min: float = attrs.field(default=0.0, validator=ge(0))  # the diffusion at s = 0

    @staticmethod
    def check_config(config: Config) -> Iterable[tuple[str, str]]:
        if config.s_max is not None and config.s_max < config.s_min:
            return [("s_max", f"must be >= s_min ({config.s_min}), got {config.s_max}")]
        return []

    def sigma_t(self, s: Tensor, s_at_one: float) -> Tensor:
        """``g(s) = s_min + (s_max - s_min) s`` in float64 (``s_max`` unset: ``s_at_one``)."""
        top = s_at_one if self.config.s_max is None else self.config.s_max
        if top < self.config.s_min:
            raise ValueError(f"flash_sde: s_max ({top}; unset: the grid's s_1) is below s_min ({self.config.s_min})")
        return self.config.s_min + (top - self.config.s_min) * s.to(torch.float64)
