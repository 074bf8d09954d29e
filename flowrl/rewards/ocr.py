"""OCR text rendering reward (Flow-GRPO's OCR reward, with RapidOCR instead of PaddleOCR; the ``ocr`` extra).

The target is the first double-quoted string in the prompt (``A sign that says "OPEN"`` -> ``OPEN``; typographic
quotes count too). The recognised text is every detected line with confidence above ``min_confidence``,
concatenated in the OCR's order. Both are lower-cased (unless ``case_sensitive``) and stripped of whitespace.

    score = 1                                         if the target occurs in the recognised text
          = 1 - min(lev(recognised, target), |target|) / |target|   otherwise

with ``lev`` the Levenshtein edit distance, so the score lies in [0, 1]. A prompt without a quoted string
(or with an empty one) scores 0. RapidOCR ships its detection and recognition models in the wheel and runs
on the CPU through onnxruntime.
"""

from __future__ import annotations

import re
from typing import Any

import attrs
import numpy as np
import torch
from attrs.validators import ge, le
from torch import Tensor

from flowrl.core.registry import register
from flowrl.rewards.base import ModelReward
from flowrl.rewards.preprocess import to_uint8

QUOTED = re.compile(r"[\"“”]([^\"“”]*)[\"“”]")


def quoted_text(prompt: str) -> str | None:
    """The first double-quoted string in ``prompt`` (None when there is none)."""
    match = QUOTED.search(prompt)
    return match.group(1) if match else None


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insertions, deletions, substitutions of one character each)."""
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def _normalise(text: str, case_sensitive: bool) -> str:
    text = "".join(text.split())
    return text if case_sensitive else text.lower()


def text_match(recognised: str, target: str | None, case_sensitive: bool = False) -> float:
    """The OCR reward for one image: 1 if ``target`` occurs in ``recognised``, else 1 - normalised edit distance."""
    if target is None:
        return 0.0
    target, recognised = _normalise(target, case_sensitive), _normalise(recognised, case_sensitive)
    if not target:
        return 0.0
    if target in recognised:
        return 1.0
    return 1.0 - min(levenshtein(recognised, target), len(target)) / len(target)


@register("reward", "ocr")
class OcrReward(ModelReward):
    """OCR: 1 - normalised edit distance between the prompt's quoted text and RapidOCR's reading (0-1)."""

    extra = "ocr"
    modules = ("rapidocr_onnxruntime",)

    @attrs.frozen
    class Config:
        min_confidence: float = attrs.field(default=0.0, validator=[ge(0.0), le(1.0)])  # keep lines above this
        case_sensitive: bool = False
        scale: float = 1.0  # reported = (raw - offset) * scale
        offset: float = 0.0
        device: str = "cpu"  # RapidOCR runs on the CPU (onnxruntime)

    def load(self, device: torch.device) -> Any:
        from rapidocr_onnxruntime import RapidOCR

        return RapidOCR()

    def read(self, image: np.ndarray) -> str:
        """The text RapidOCR reads in one ``H x W x 3`` RGB uint8 image."""
        engine = self.model()
        result, _ = engine(np.ascontiguousarray(image[..., ::-1]))  # RapidOCR takes arrays as BGR (OpenCV)
        lines = result or []
        return "".join(str(line[1]) for line in lines if float(line[2]) > self.config.min_confidence)

    def score(self, images: Tensor, prompts: list[str]) -> Tensor:
        self.check_prompts(images, prompts)
        scores = []
        for image, prompt in zip(to_uint8(images), prompts, strict=True):
            target = quoted_text(prompt)
            read = self.read(image) if target else ""
            scores.append(text_match(read, target, self.config.case_sensitive))
        return self.rescale(torch.tensor(scores, dtype=torch.float32))
