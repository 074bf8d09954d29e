"""A logged value as a number, or nothing: what every reader of ``metrics.jsonl`` rows needs.

A row holds numbers, but also text, booleans, ``NaN`` and missing keys; the bench's curves and the run
report's panels both keep only the finite numbers. It lives here, below both, so neither imports the other.
"""

from __future__ import annotations

import math
from typing import Any


def finite_number(value: Any) -> float | None:
    """``value`` as a float if it is a finite int or float (not a bool), else ``None``."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None
