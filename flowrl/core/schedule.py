"""The shifted flow-matching sampling grid (SD3/FLUX style)."""

from __future__ import annotations

import torch


def shifted_sigmas(num_steps: int, shift: float) -> torch.Tensor:
    """Noise levels ``s_0 = 1 > ... > s_N = 0`` (float64, length ``N + 1``).

    ``u_j = 1 - j / N`` and ``s_j = k u_j / (1 + (k - 1) u_j)`` with shift ``k`` (docs/algorithms.md, notation).

    This equals (to float32 rounding) the grid diffusers builds from the ``sigmas`` that ``FluxPipeline``
    passes, ``np.linspace(1, 1 / N, N)``, shifted by ``FlowMatchEulerDiscreteScheduler(shift=k)`` without
    dynamic shifting, followed by the final 0. It is not the scheduler's default ``set_timesteps(N)`` grid
    (what ``StableDiffusion3Pipeline`` uses when given no ``sigmas``): that one shifts
    ``linspace(1, sigma_min, N)``, ``sigma_min`` being the scheduler's smallest (already shifted) training
    level, so its last non-zero level is about 0.009 at shift 3 instead of ``s_{N-1} = k / (N + k - 1)``: the
    two grids differ by up to 0.16 at N = 16 and 0.24 at N = 10 (shift 3), most at that level. The ``sd3``
    backbone's ``grid = "diffusers"`` selects the scheduler's grid instead (docs/models.md).
    """
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    if shift <= 0:
        raise ValueError(f"shift must be > 0, got {shift}")
    u = 1.0 - torch.arange(num_steps + 1, dtype=torch.float64) / num_steps
    sigmas = shift * u / (1.0 + (shift - 1.0) * u)
    sigmas[-1] = 0.0
    return sigmas
