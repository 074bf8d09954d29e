"""Temporal gradient rectification (TGR): per-step loss weights that even out the policy-gradient scale.

For a Gaussian step ``x' = mean + S e`` with ``mean = a x + b v``, the log-density's gradient in the velocity is
``d log p / d v = b (x' - mean) / S^2 = b e / S``: the policy gradient of one step is scaled by ``c = |b| / S``,
which differs from step to step (by about 2x over the first half of a 20-step grid). TGR multiplies each step's
loss by ``w = (1 / c) / mean_pool(1 / c)``, the mean taken over the candidate steps, so every step moves the
velocity alike and the weights average 1 over the pool.

``c`` is read off the registered kernel itself, not from a formula: the gradient, by autograd, of the kernel's own
``log_prob`` at the point one std above the mean (``e = 1``), with respect to the velocity, in one dimension.
For a Gaussian log-density this is exactly ``|b| / S`` for any kernel whose mean is linear in ``v``; a kernel with
another ``log_prob`` (CPS's ``"official"`` form) gets the scale of the ratio it actually trains.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from flowrl.core.interfaces import TransitionKernel
from flowrl.core.types import Schedule


def gradient_scale(kernel: TransitionKernel, s: Tensor, s_next: Tensor, s_at_one: float) -> Tensor:
    """``c = |d log p(mean + std) / d v|`` per row ``(B,)`` for steps ``s -> s_next`` (float tensors ``(B,)``), from
    the kernel's ``mean_std`` and ``log_prob`` by autograd on one-dimensional latents ``x = 0``, ``v = 0``."""
    n = int(s.shape[0])
    x = torch.zeros((n, 1), dtype=torch.float32)
    v = torch.zeros((n, 1), dtype=torch.float32, requires_grad=True)
    with torch.enable_grad():
        mean, std = kernel.mean_std(x, v, s.float(), s_next.float(), s_at_one)
        if float(std.min()) <= 0:
            raise ValueError("temporal gradient rectification needs a stochastic step (std > 0) at every candidate")
        point = mean.detach() + std.detach().reshape(n, 1)  # the sample one std above the mean
        (grad,) = torch.autograd.grad(kernel.log_prob(point, mean, std).sum(), v)
    return grad.reshape(n).abs().double()


def step_scales(schedule: Schedule, steps: Sequence[int]) -> Tensor:
    """:func:`gradient_scale` of one step from each grid step in ``steps`` of ``schedule`` (float64)."""
    sig = schedule.tensor().double()
    index = torch.tensor(list(steps), dtype=torch.long)
    return gradient_scale(schedule.kernel, sig[index], sig[index + 1], schedule.s_at_one)


def rectification_weights(schedule: Schedule, pool: Sequence[int]) -> Tensor:
    """TGR weights ``w_k = (1 / c_k) / mean_pool(1 / c)`` for each step ``k`` of the candidate ``pool`` (float32,
    mean exactly 1 up to rounding)."""
    inverse = 1.0 / step_scales(schedule, pool)
    return (inverse / inverse.mean()).float()
