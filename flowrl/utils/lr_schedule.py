"""The learning-rate factor of a step: linear warm-up, then constant, linear or cosine decay to a floor."""

from __future__ import annotations

import math
from typing import Literal

from flowrl.core.choices import values

LrDecay = Literal["constant", "linear", "cosine"]
LR_DECAYS = values(LrDecay)


def lr_factor(k: int, warmup: int, decay: str, steps: int, floor: float) -> float:
    """The factor on the base learning rate at optimizer step ``k`` (0-based): ``(k + 1) / warmup`` during the
    ``warmup`` steps, then 1 (``constant``), or from 1 down to ``floor`` at step ``steps`` along a line
    (``linear``) or a half cosine (``cosine``), and ``floor`` after it."""
    if k < warmup:
        return (k + 1) / warmup
    if decay == "constant":
        return 1.0
    progress = min(1.0, (k - warmup) / max(1, steps - warmup))
    if decay == "linear":
        return floor + (1 - floor) * (1 - progress)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
