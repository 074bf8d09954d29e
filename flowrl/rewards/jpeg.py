"""JPEG compressibility: a weight-free reward (smaller files score higher)."""

from __future__ import annotations

import io

import attrs
import numpy as np
import torch
from attrs.validators import gt, in_
from PIL import Image
from torch import Tensor

from flowrl.core.interfaces import RewardModel
from flowrl.core.registry import register


def jpeg_size_kb(image: np.ndarray, quality: int) -> float:
    """Size in kB of an ``H x W x 3`` uint8 image saved as JPEG."""
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="JPEG", quality=quality)
    return buffer.tell() / 1000.0


def to_uint8(images: Tensor) -> np.ndarray:
    """``(B, 3, H, W)`` floats in [0, 1] to ``(B, H, W, 3)`` uint8."""
    array = (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8)
    return array.permute(0, 2, 3, 1).cpu().numpy()


@register("reward", "jpeg_compressibility")
class JpegCompressibility(RewardModel):
    """JPEG compressibility, -size_kB / scale_kb (DDPO's convention with scale_kb = 500); no weights."""

    @attrs.frozen
    class Config:
        quality: int = attrs.field(default=95, validator=in_(range(1, 101)))  # JPEG quality
        scale_kb: float = attrs.field(default=500.0, validator=gt(0))  # kB per reward unit

    def score(self, images: Tensor, prompts: list[str]) -> Tensor:
        sizes = [jpeg_size_kb(img, self.config.quality) for img in to_uint8(images)]
        return -torch.tensor(sizes, dtype=torch.float32) / self.config.scale_kb
