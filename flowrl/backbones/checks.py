"""Settings checks shared by backbones, run at recipe load (``Component.check_config``) before any model is built."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def spec_problems(build: Callable[[], Any], renames: Mapping[str, str], keys: Iterable[str]) -> list[tuple[str, str]]:
    """Build a tiny backbone's spec (cheap, no model) and turn its refusal into ``(recipe key, message)``: the
    spec's field names (``renames``: spec name -> recipe key) replaced by the recipe's, and the key the first
    recipe key the message names, in reading order ("" if none)."""
    try:
        build()
    except ValueError as error:
        text = str(error)
        for old, new in renames.items():
            text = re.sub(rf"\b{old}\b", new, text)
        found = [(m.start(), k) for k in keys if (m := re.search(rf"\b{k}\b", text))]
        key = min(found)[1] if found else ""
        return [(key, text)]
    return []


def multiple_of(resolution: int, factor: int, why: str) -> list[tuple[str, str]]:
    """``resolution`` must be a multiple of ``factor`` (the pipeline would otherwise resize or refuse)."""
    if resolution % factor:
        return [("resolution", f"must be a multiple of {factor} ({why}), got {resolution}")]
    return []
