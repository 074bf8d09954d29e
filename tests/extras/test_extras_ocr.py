"""The OCR reward with the real RapidOCR engine (its models ship in the wheel) on rendered text."""

from __future__ import annotations

import os

import pytest

if os.environ.get("FLOWRL_EXTRAS") != "1":  # set by `nox -s extras`; the main environment lacks these packages
    pytest.skip("needs the extras environment (nox -s extras)", allow_module_level=True)

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

from flowrl.core.registry import build


def rendered(text: str) -> torch.Tensor:
    img = Image.new("RGB", (320, 128), (245, 245, 240))
    font = ImageFont.load_default(size=56)
    ImageDraw.Draw(img).text((20, 30), text, fill=(10, 10, 10), font=font)
    return torch.from_numpy(np.asarray(img, dtype=np.float32) / 255.0).permute(2, 0, 1)


def test_right_text_scores_high_and_wrong_text_low() -> None:
    reward = build("reward", {"type": "ocr"})
    reward.check()
    images = torch.stack([rendered("HELLO")] * 3 + [rendered("")])
    prompts = [
        'a shop sign that says "HELLO"',
        'a shop sign that says "GOODBYE"',
        'a shop sign that says "HELP"',
        'a blank sign that says "HELLO"',
    ]
    scores = reward.score(images, prompts).tolist()
    assert scores[0] == 1.0, scores
    assert scores[1] <= 0.4, scores
    assert 0.5 <= scores[2] < 1.0, scores  # 'hello' vs 'help': one substitution, one insertion
    assert scores[3] == 0.0, scores


def test_the_ocr_suite_scores_with_the_real_engine(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The `ocr` suite's default scorer is this reward: right text 1, wrong text low, per prompt."""
    (tmp_path / "ocr.txt").write_text('a shop sign that says "HELLO"\na shop sign that says "GOODBYE"\n')
    suite = build("suite", {"type": "ocr", "prompts": str(tmp_path / "ocr.txt")})
    suite.check()
    items = suite.items()
    rows = suite.score(torch.stack([rendered("HELLO"), rendered("HELLO")]), items)
    assert rows[0]["ocr"] == 1.0 and rows[1]["ocr"] <= 0.4, rows
    assert suite.aggregate(rows, items)["ocr"] == (rows[0]["ocr"] + rows[1]["ocr"]) / 2
