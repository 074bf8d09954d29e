"""AEGPO's global allocation (arXiv 2602.06825): a fixed rollout budget shared out by ΔEntropy.

Pure maths, no model: :func:`delta_entropy` turns current and base attention entropies into the per-prompt
learning-value proxy, :func:`allocation_weights` maps it to non-negative weights, and :func:`allocate`
turns weights into integer group sizes that

- sum exactly to the budget,
- stay within ``[min_size, max_size]``,
- never give a prompt with a smaller ΔEntropy more rollouts than one with a larger ΔEntropy.

``allocate`` hands out rollouts one at a time, starting every prompt at ``min_size``, to the prompt with
the largest quotient ``w / (size + 1)`` (a divisor method: sizes approach ``budget * w / sum(w)`` within
the bounds); ties go to the larger ΔEntropy, then to the earlier prompt.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

Method = Literal["proportional", "softmax", "tiers"]


def delta_entropy(current: Sequence[Sequence[float]], base: Sequence[Sequence[float]]) -> list[float]:
    """``mean over probe steps of |H_current - H_base| / H_base``, one value per prompt."""
    out = []
    for cur, ref in zip(current, base, strict=True):
        if len(cur) != len(ref) or not cur:
            raise ValueError(f"entropy curves of different or zero length: {len(cur)} and {len(ref)}")
        out.append(sum(abs(c - b) / max(abs(b), 1e-12) for c, b in zip(cur, ref, strict=True)) / len(cur))
    return out


def allocation_weights(delta: Sequence[float], method: Method, temperature: float = 1.0, tiers: int = 3) -> list[float]:
    """Non-negative weights, non-decreasing in ``delta``; all equal when every ``delta`` is equal.

    - ``proportional``: ``w = delta`` (all zero: uniform).
    - ``softmax``: ``w = exp(z / temperature)`` with ``z = delta / mean(delta)`` (scale-free: ΔEntropy is
      tiny early in training, so a fixed temperature on raw values would be uniform).
    - ``tiers``: prompts ranked by ``delta`` and cut into ``tiers`` equal bands; band ``b`` weighs ``b + 1``.
    """
    d = [max(0.0, float(x)) if math.isfinite(x) else 0.0 for x in delta]
    n = len(d)
    if n == 0:
        return []
    if method == "proportional":
        return d if sum(d) > 0 else [1.0] * n
    if method == "softmax":
        if temperature <= 0:
            raise ValueError(f"softmax temperature must be > 0, got {temperature}")
        mean = sum(d) / n
        z = [x / mean if mean > 0 else 0.0 for x in d]
        top = max(z)
        return [math.exp((x - top) / temperature) for x in z]
    if method == "tiers":
        if tiers < 1:
            raise ValueError(f"tiers must be >= 1, got {tiers}")
        order = sorted(range(n), key=lambda i: (d[i], i))
        weights = [0.0] * n
        for rank, i in enumerate(order):
            weights[i] = float(rank * tiers // n + 1)
        # Equal deltas share the lowest band among them (weights stay a function of delta).
        for i in range(n):
            weights[i] = min(weights[j] for j in range(n) if d[j] == d[i])
        return weights
    raise ValueError(f"unknown allocation method {method!r}; use proportional, softmax or tiers")


def allocate(
    weights: Sequence[float], budget: int, min_size: int, max_size: int, order_key: Sequence[float] | None = None
) -> list[int]:
    """Integer group sizes summing to ``budget`` within ``[min_size, max_size]``, non-decreasing in weight.

    ``order_key`` (ΔEntropy) breaks ties between equal quotients: the larger key wins, then the earlier
    prompt. Raises when the budget cannot be met within the bounds.
    """
    n = len(weights)
    if min_size < 0 or max_size < min_size:
        raise ValueError(f"need 0 <= min_size <= max_size, got {min_size}, {max_size}")
    if not n * min_size <= budget <= n * max_size:
        raise ValueError(f"budget {budget} cannot be split into {n} groups of {min_size}..{max_size}")
    w = [max(0.0, float(x)) if math.isfinite(x) else 0.0 for x in weights]
    top = max(w)  # scale to max 1 so quotients of tiny (even subnormal) weights do not underflow to ties
    w = [x / top for x in w] if top > 0 else [1.0] * n
    key = [float(x) if math.isfinite(x) else 0.0 for x in order_key] if order_key is not None else w
    sizes = [min_size] * n
    for _ in range(budget - n * min_size):
        best = max(
            (i for i in range(n) if sizes[i] < max_size),
            key=lambda i: (w[i] / (sizes[i] + 1), key[i], -i),
        )
        sizes[best] += 1
    return sizes


def group_sizes(
    delta: Sequence[float],
    budget: int,
    min_size: int,
    max_size: int,
    method: Method = "proportional",
    temperature: float = 1.0,
    tiers: int = 3,
) -> list[int]:
    """ΔEntropy to group sizes: :func:`allocation_weights` then :func:`allocate`."""
    weights = allocation_weights(delta, method, temperature, tiers)
    return allocate(weights, budget, min_size, max_size, order_key=[float(x) for x in delta])
