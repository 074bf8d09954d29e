"""Noise levels of a Diffusion-DPO update: logit-normal (the flow-matching trainers' choice) or uniform."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

TimeDistribution = Literal["logit_normal", "uniform"]
EDGE = 1e-3  # levels are kept in [EDGE, 1 - EDGE]: the target (x_t - x0) / t is recovered from x_t


def pair_times(
    n: int, distribution: TimeDistribution, mean: float, std: float, shift: float, generator: torch.Generator
) -> Tensor:
    """``n`` noise levels: ``u = sigmoid(mean + std z)``, ``z ~ N(0, 1)`` (``logit_normal``) or ``u ~ U(0, 1)``,
    then warped by the time shift ``t = k u / (1 + (k - 1) u)`` (``k = 1``: unchanged) and clamped to
    ``[1e-3, 1 - 1e-3]``."""
    if distribution == "logit_normal":
        u = torch.sigmoid(mean + std * torch.randn(n, generator=generator))
    else:
        u = torch.rand(n, generator=generator)
    return (shift * u / (1.0 + (shift - 1.0) * u)).clamp(EDGE, 1.0 - EDGE)
