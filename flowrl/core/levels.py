"""Noise levels as a transition kernel takes them: a float tensor of shape ``(B,)``, one level per row.

What a user naturally has is a float (``schedule.sigmas[i]`` is a tuple of Python floats); the kernels'
methods accept it and give every row that level. Anything else is refused in one line naming the argument.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor


def as_levels(value: Any, batch: int, device: torch.device | str, name: str) -> Tensor:
    """``value`` (a tensor, a number or a sequence of ``batch`` numbers) as a float tensor ``(batch,)``."""
    if isinstance(value, Tensor):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return torch.full((batch,), float(value), dtype=torch.float32, device=device)
    if isinstance(value, list | tuple) and len(value) == batch and all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in value):
        return torch.tensor([float(v) for v in value], dtype=torch.float32, device=device)
    raise TypeError(f"{name}: expected a noise level as a float tensor of shape ({batch},), a number or {batch}"
                    f" numbers, got {type(value).__name__}")


def accepting_floats(method: Callable[..., Any]) -> Callable[..., Any]:
    """A kernel's ``mean_std(x, v, s, s_next, s_at_one)`` that also takes ``s`` and ``s_next`` as numbers (a
    tensor passes through untouched)."""

    @functools.wraps(method)
    def mean_std(self: Any, x: Tensor, v: Tensor, s: Any, s_next: Any, *args: Any, **kwargs: Any) -> Any:
        if not (isinstance(s, Tensor) and isinstance(s_next, Tensor)):
            where = f"{type(self).__name__}.mean_std"
            s = as_levels(s, x.shape[0], x.device, f"{where}: s")
            s_next = as_levels(s_next, x.shape[0], x.device, f"{where}: s_next")
        return method(self, x, v, s, s_next, *args, **kwargs)

    return mean_std
