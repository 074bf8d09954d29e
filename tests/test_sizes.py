"""Sizes written in recipes (trainer.memory_budget)."""

from __future__ import annotations

import pytest

from flowrl.utils.sizes import parse_size, show_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [("600MB", (600 * 10**6, None)), ("1.5GiB", (3 * 2**29, None)), ("2g", (2 * 2**30, None)),
     ("512 KiB", (2**19, None)), ("0.6", (None, 0.6)), ("1", (None, 1.0)), ("4096", (4096, None)), (".5", (None, 0.5))],
)
def test_parse_size(text: str, expected: tuple[int | None, float | None]) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "0", "-1GB", "5 parsecs", "1e9"])
def test_parse_size_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="size"):
        parse_size(text)


def test_show_size() -> None:
    assert show_size(3 * 2**29) == "1.50 GiB" and show_size(2**20) == "1.0 MiB"
