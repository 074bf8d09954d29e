"""What every conformance check shares: the error it raises and small tensor helpers."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn


class ConformanceError(AssertionError):
    """A part broke one of its interface's rules (the message names the part and the rule)."""


def require(condition: bool, part: object, rule: str) -> None:
    """Raise :class:`ConformanceError` naming ``part`` and ``rule`` unless ``condition`` holds."""
    if not condition:
        name = getattr(part, "registered_name", "") or ""
        label = f"{type(part).__name__} ('{name}')" if name else type(part).__name__
        raise ConformanceError(f"{label}: {rule}")


def finite(value: Tensor) -> bool:
    return bool(torch.isfinite(value).all())


def finite_stats(stats: Any) -> bool:
    """A mapping of names to finite plain numbers (what the trainer logs and averages)."""
    if not isinstance(stats, Mapping):
        return False
    return all(
        isinstance(key, str) and isinstance(value, int | float) and not isinstance(value, bool)
        and math.isfinite(value)
        for key, value in stats.items()
    )


def close(a: Tensor, b: Tensor, tolerance: float) -> bool:
    """``a`` and ``b`` agree within ``tolerance`` times the larger magnitude of either (at least 1)."""
    if a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    scale = max(1.0, float(a.detach().abs().max()), float(b.detach().abs().max()))
    return bool(((a.detach().double() - b.detach().double()).abs() <= tolerance * scale).all())


@contextmanager
def counting_rows(module: nn.Module) -> Iterator[list[int]]:
    """Counts the rows the transformer evaluates: dim 0 of the first tensor argument (the latents) of every
    call of ``module``; the count is ``[rows]``, read after the calls."""
    rows = [0]

    def hook(_: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        first = next((v for v in (*args, *kwargs.values()) if isinstance(v, Tensor)), None)
        rows[0] += int(first.shape[0]) if first is not None else 1

    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield rows
    finally:
        handle.remove()
