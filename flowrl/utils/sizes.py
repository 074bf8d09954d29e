"""Memory sizes written in recipes: ``"600MB"``, ``"1.5GiB"``, ``"2g"``, or a share of the device's memory
(``"0.6"``: 60%). ``MB``/``GB`` are powers of 1000, ``MiB``/``GiB`` of 1024 (a bare ``K``/``M``/``G`` too)."""

from __future__ import annotations

import re

UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6, "mib": 2**20,
         "g": 2**30, "gb": 10**9, "gib": 2**30, "t": 2**40, "tb": 10**12, "tib": 2**40}
SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> tuple[int | None, float | None]:
    """``(bytes, None)`` for a size, ``(None, share)`` for a share in (0, 1]; ValueError for anything else.
    A bare number is a share when it is at most 1, else a count of bytes."""
    match = SIZE.match(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in UNITS:
        raise ValueError(f"{text!r} is not a size (such as '600MB' or '1.5GiB') or a share of memory (such as '0.6')")
    value = float(match.group(1))
    if not unit and 0 < value <= 1:
        return None, value
    if value <= 0:
        raise ValueError(f"{text!r}: a size must be positive")
    return int(value * UNITS[unit]), None


def show_size(n: float) -> str:
    """``n`` bytes as MiB or GiB with one decimal."""
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"
