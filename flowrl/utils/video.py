"""Video clips as flowrl passes them around: a video backbone's ``decode`` gives clips ``(B, F, 3, H, W)`` in
[0, 1] (frames-major, so ``clip[:, f]`` is a batch of images), where an image backbone gives ``(B, 3, H, W)``.

This module chooses frames (:func:`frame_indices`: the ``frames`` setting of a ``[[reward]]``), lays clips out
as stills (:func:`as_stills`: chosen frames side by side, for grids, TensorBoard and the run report) and writes
animations (:func:`write_animation`: animated WebP or GIF, with Pillow).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

FrameChoice = int | str | Sequence[int] | None
DEFAULT_FRAMES = 8  # frames a frame reward scores when the recipe does not say (evenly spaced, first and last kept)
STILL_FRAMES = 8  # frames a clip shows side by side in a still grid: every frame of a clip up to 8
ANIMATION_SUFFIXES = (".webp", ".gif")


def is_clip(images: Tensor) -> bool:
    """Whether ``images`` is a batch of clips ``(B, F, 3, H, W)`` rather than of images ``(B, 3, H, W)``."""
    return images.dim() == 5


def frame_choice_problem(frames: object) -> str | None:
    """Why ``frames`` (a recipe's ``[[reward]] frames``) is not a valid choice, or None: a positive count, a
    non-empty list of distinct non-negative frame indices, or ``"all"``."""
    if frames is None or frames == "all":
        return None
    if isinstance(frames, bool):
        return f"expected a positive count, a list of frame indices or \"all\", got {frames!r}"
    if isinstance(frames, int):
        return None if frames > 0 else f"a frame count must be positive, got {frames}"
    if isinstance(frames, list | tuple):
        if not frames or not all(isinstance(f, int) and not isinstance(f, bool) and f >= 0 for f in frames):
            return f"expected a non-empty list of non-negative frame indices, got {list(frames)!r}"
        if len(set(frames)) != len(frames):
            return f"frame indices must be distinct, got {list(frames)!r}"
        return None
    return f"expected a positive count, a list of frame indices or \"all\", got {frames!r}"


def frame_indices(num_frames: int, frames: FrameChoice = None) -> list[int]:
    """The frames of a ``num_frames`` clip that ``frames`` chooses.

    ``None``: :data:`DEFAULT_FRAMES` evenly spaced; a count ``k``: ``k`` evenly spaced, the first and the last
    included (every frame when the clip has at most ``k``); ``"all"``: every frame; a list: those indices (each
    must exist in the clip).
    """
    if frames == "all":
        return list(range(num_frames))
    if isinstance(frames, list | tuple):
        missing = [f for f in frames if f >= num_frames]
        if missing:
            raise ValueError(f"frames {missing} do not exist in a clip of {num_frames} frames")
        return [int(f) for f in frames]
    count = DEFAULT_FRAMES if frames is None else int(frames)  # type: ignore[arg-type]
    if count >= num_frames:
        return list(range(num_frames))
    if count == 1:
        return [num_frames // 2]
    return sorted({round(i * (num_frames - 1) / (count - 1)) for i in range(count)})


def as_stills(images: Tensor, frames: int = STILL_FRAMES) -> Tensor:
    """Images unchanged; clips as images with ``frames`` evenly spaced frames side by side ``(B, 3, H, k W)``."""
    if not is_clip(images):
        return images
    chosen = images[:, frame_indices(images.shape[1], frames)]  # (B, k, 3, H, W)
    b, k, c, h, w = chosen.shape
    return chosen.permute(0, 2, 3, 1, 4).reshape(b, c, h, k * w)


def write_animation(frames: Tensor, path: Path, fps: float = 8.0, scale: int = 1) -> None:
    """Write ``frames`` ``(F, 3, H, W)`` in [0, 1] as an animated WebP (lossless) or GIF, by ``path``'s suffix,
    looping, ``fps`` frames a second, nearest-neighbour upscaled ``scale`` times."""
    from PIL import Image

    suffix = path.suffix.lower()
    if suffix not in ANIMATION_SUFFIXES:
        raise ValueError(f"an animation is written as {' or '.join(ANIMATION_SUFFIXES)}, not '{path.suffix}'")
    pixels = (frames.detach().float().cpu().clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    pictures = [Image.fromarray(p) for p in pixels]
    if scale > 1:
        pictures = [p.resize((p.width * scale, p.height * scale), Image.NEAREST) for p in pictures]
    duration = max(1, round(1000 / fps))
    options = {"lossless": True} if suffix == ".webp" else {"disposal": 2}
    pictures[0].save(path, save_all=True, append_images=pictures[1:], duration=duration, loop=0, **options)
