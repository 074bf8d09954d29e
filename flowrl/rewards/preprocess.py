"""CLIP-style image preprocessing in torch and PIL (no torchvision): resize, centre crop or pad, normalise.

Images come in as ``(B, 3, H, W)`` floats in [0, 1] on any device and leave as ``(B, 3, S, S)`` float32
on the same device. Two resize back-ends reproduce the two references the reward models were trained with:

``pil``
    Each image is quantised to uint8 and resized with PIL's bicubic filter, as the transformers
    ``CLIPImageProcessor`` (PickScore, CLIPScore, the LAION aesthetic predictor) and torchvision's
    ``Resize`` on a PIL image (ImageReward) do. Bit-for-bit the processors' input for a uint8 image.
``torch``
    ``torch.nn.functional.interpolate(mode="bicubic", antialias=True)`` on the float tensor, on its
    device: what torchvision's ``Resize`` does on a tensor (hpsv2's ``preprocess_val`` converts to a tensor
    first). Within about 1/255 of the PIL path on smooth images.

``fit="crop"`` resizes the shortest side to ``size`` and crops the centre ``crop x crop`` (CLIP);
``fit="pad"`` resizes the longest side to ``size`` and pads the rest with zeros (hpsv2's ``ResizeMaxSize``).
"""

from __future__ import annotations

from typing import Literal

import attrs
import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor

Resize = Literal["pil", "torch"]  # the two resize back-ends below
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)  # OpenAI CLIP's normalisation (also OpenCLIP's, HPS's, BLIP's)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@attrs.frozen
class ImagePreprocess:
    """One reference preprocessing: resize, centre crop (or pad) and normalise."""

    size: int = 224  # target of the resized side (shortest side for "crop", longest for "pad")
    crop: int = 224  # output side
    mean: tuple[float, ...] = CLIP_MEAN
    std: tuple[float, ...] = CLIP_STD
    fit: Literal["crop", "pad"] = "crop"
    backend: Resize = "pil"

    def __call__(self, images: Tensor) -> Tensor:
        if images.dim() != 4 or images.shape[1] != 3:
            raise ValueError(f"expected images (B, 3, H, W), got shape {tuple(images.shape)}")
        h, w = images.shape[-2:]
        out_h, out_w = resized_shape(h, w, self.size, self.fit)
        if self.backend == "pil":
            resized = resize_pil(images, out_h, out_w)
        else:
            resized = resize_torch(images.float(), out_h, out_w)
        fitted = center_crop(resized, self.crop) if self.fit == "crop" else pad_to_square(resized, self.crop)
        return normalize(fitted, self.mean, self.std)


def resized_shape(h: int, w: int, size: int, fit: str) -> tuple[int, int]:
    """The resized ``(h, w)``: shortest side to ``size`` (``crop``; the long side truncated, as the CLIP
    processor and torchvision do) or longest side to ``size`` (``pad``; rounded, as hpsv2 does)."""
    if fit == "crop":
        if h <= w:
            return size, int(size * w / h)
        return int(size * h / w), size
    scale = size / max(h, w)
    return round(h * scale), round(w * scale)


def to_uint8(images: Tensor) -> np.ndarray:
    """``(B, 3, H, W)`` floats in [0, 1] to ``(B, H, W, 3)`` uint8 (rounded, as PIL conversions do)."""
    array = (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8)
    return array.permute(0, 2, 3, 1).cpu().numpy()


def resize_pil(images: Tensor, h: int, w: int) -> Tensor:
    """PIL bicubic resize of the uint8-quantised images; returns floats in [0, 1] on the images' device."""
    out = []
    for array in to_uint8(images):
        img = Image.fromarray(array)
        if img.size != (w, h):
            img = img.resize((w, h), resample=Image.Resampling.BICUBIC)
        out.append(torch.from_numpy(np.asarray(img, dtype=np.float32).copy()))
    return (torch.stack(out).permute(0, 3, 1, 2) / 255.0).to(images.device)


def resize_torch(images: Tensor, h: int, w: int) -> Tensor:
    """Antialiased bicubic resize of float images on their device (torchvision's tensor ``Resize``)."""
    if tuple(images.shape[-2:]) == (h, w):
        return images
    return F.interpolate(images, size=(h, w), mode="bicubic", align_corners=False, antialias=True)


def center_crop(images: Tensor, crop: int) -> Tensor:
    """The centre ``crop x crop`` (offsets rounded down, as the CLIP processor does); pads with 0 if smaller."""
    h, w = images.shape[-2:]
    if h < crop or w < crop:
        images = pad_to_square(images, max(crop, h, w))
        h, w = images.shape[-2:]
    top, left = (h - crop) // 2, (w - crop) // 2
    return images[..., top : top + crop, left : left + crop]


def pad_to_square(images: Tensor, side: int) -> Tensor:
    """Zero-pad to ``side x side``, the image centred (hpsv2's ``ResizeMaxSize`` layout)."""
    h, w = images.shape[-2:]
    pad_h, pad_w = side - h, side - w
    if pad_h == 0 and pad_w == 0:
        return images
    return F.pad(images, (pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2), value=0.0)


def normalize(images: Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> Tensor:
    m = torch.tensor(mean, dtype=torch.float32, device=images.device).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=torch.float32, device=images.device).view(1, -1, 1, 1)
    return (images.float() - m) / s
