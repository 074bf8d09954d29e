"""Prompt words outside a word-level vocabulary are reported once, naming them."""

from __future__ import annotations

import pytest

import flowrl


@pytest.mark.parametrize("kind", ["tiny_flux", "tiny_sd3"])
def test_unknown_words_are_reported_once(kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    backbone = flowrl.build("backbone", {"type": kind, "resolution": 16})
    backbone.encode(["a red circle"])
    assert capsys.readouterr().err == ""  # every word known: silent
    backbone.encode(["a crimson circle", "two mauve squares", "a crimson square"])
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["warning: prompt words outside the model's vocabulary are read as <unk>: 'crimson', 'mauve' "
                   "(first in 'a crimson circle')"]
    backbone.encode(["a crimson triangle", "one mauve circle"])  # known unknowns: said already
    assert capsys.readouterr().err == ""
