"""Each prompt's text encoding, computed once per backbone: the prompts a batch brings that the cache lacks are
checked for unknown words and encoded in one call, in sorted order (so the order of a batch cannot change the
values a prompt is cached with), then kept."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

from flowrl.backbones.common.vocabulary import UnknownWords

Row = TypeVar("Row")


def cached_encodings(
    cache: dict[str, Row], unknown: UnknownWords, prompts: list[str], encode: Callable[[list[str]], Iterable[Row]]
) -> list[Row]:
    """``prompts``' rows from ``cache``, the missing ones first encoded by ``encode`` (one row per prompt given)."""
    missing = sorted({p for p in prompts if p not in cache})
    if missing:
        unknown.check(missing)
        for prompt, row in zip(missing, encode(missing), strict=True):
            cache[prompt] = row
    return [cache[p] for p in prompts]
