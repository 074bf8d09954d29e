"""The shifted flow-matching sampling grid (SD3/FLUX style)."""

from __future__ import annotations

import torch


def shifted_sigmas(num_steps: int, shift: float) -> torch.Tensor:
    """Noise levels ``s_0 = 1 > ... > s_N = 0`` (float64, length ``N + 1``).

    ``u_j = 1 - j / N`` and ``s_j = k u_j / (1 + (k - 1) u_j)`` with shift ``k`` (ALGORITHMS.md, notation);
    identical to diffusers' ``FlowMatchEulerDiscreteScheduler(shift=k)`` without dynamic shifting.
    """
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    if shift <= 0:
        raise ValueError(f"shift must be > 0, got {shift}")
    u = 1.0 - torch.arange(num_steps + 1, dtype=torch.float64) / num_steps
    sigmas = shift * u / (1.0 + (shift - 1.0) * u)
    sigmas[-1] = 0.0
    return sigmas
