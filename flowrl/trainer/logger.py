"""Run logging: ``metrics.jsonl`` (one object per iteration), and scalars and image grids to the trackers of
``trainer.loggers`` (TensorBoard by default; :mod:`flowrl.trainer.trackers`)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from flowrl.core.conditions import conditions_of
from flowrl.trainer.runfolder import read_metrics
from flowrl.trainer.trackers import open_trackers
from flowrl.utils.jsonl import append_rows
from flowrl.utils.video import as_stills, is_clip


class RunLogger:
    """Appends metrics to ``metrics.jsonl`` and mirrors them to the trackers of ``recipe.trainer.loggers``
    (TensorBoard under ``tb/`` without a recipe), which also get the resolved recipe."""

    def __init__(
        self, run_dir: Path, enabled: bool = True, truncate_after: int | None = None, recipe: Any = None
    ) -> None:
        self.enabled = enabled
        self.path = Path(run_dir) / "metrics.jsonl"
        self.trackers: list[Any] = []
        if not enabled:
            return
        if truncate_after is not None and self.path.exists():  # a resumed run: drop rows after the checkpoint
            keep = [row for row in read_metrics(self.path) if row["step"] <= truncate_after]
            self.path.write_text("".join(json.dumps(row) + "\n" for row in keep))
        loggers = tuple(recipe.trainer.loggers) if recipe is not None else ("tensorboard",)
        self.trackers = open_trackers(loggers, Path(run_dir), recipe.to_dict() if recipe is not None else {})

    def log(self, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}
        append_rows(self.path, [clean])  # after mending a tail a kill tore
        step = int(metrics["step"])
        numbers = {k: v for k, v in metrics.items() if k != "step" and isinstance(v, int | float) and v is not None}
        for tracker in self.trackers:
            tracker.scalars(numbers, step)

    def images(self, tag: str, images: Tensor, step: int, rows: int) -> None:
        if self.enabled and self.trackers:
            grid = image_grid(images, rows)
            for tracker in self.trackers:
                tracker.image(tag, grid, step)

    def histogram(self, tag: str, values: Tensor, step: int) -> None:
        if self.enabled and values.numel():
            for tracker in self.trackers:
                tracker.histogram(tag, values.detach().float().cpu(), step)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()
        self.trackers = []


def image_grid(images: Tensor, rows: int, gap: int = 0) -> Tensor:
    """``(B, 3, H, W)`` to one ``(3, rows*H, cols*W)`` grid (row-major), with ``gap`` white pixels between tiles;
    clips ``(B, F, 3, H, W)`` show their frames side by side each (:func:`flowrl.utils.video.as_stills`)."""
    images = as_stills(images)
    b, c, h, w = images.shape
    rows = max(1, min(rows, b))
    cols = math.ceil(b / rows)
    grid = torch.ones(c, rows * h + (rows - 1) * gap, cols * w + (cols - 1) * gap)
    for i in range(b):
        r, k = divmod(i, cols)
        y, x = r * (h + gap), k * (w + gap)
        grid[:, y : y + h, x : x + w] = images[i].detach().float().cpu()
    return grid


def save_grid_png(images: Tensor, rows: int, path: Path, scale: int = 4, gap: int = 1) -> None:
    """Write an image grid as a PNG (nearest-neighbour upscaled for small images; tiles apart by ``gap`` pixels
    before scaling, so that one sees which tiles are which)."""
    from PIL import Image

    grid = (image_grid(images, rows, gap).clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
    image = Image.fromarray(grid)
    if scale > 1:
        image = image.resize((image.width * scale, image.height * scale), Image.NEAREST)
    image.save(path)


def save_grid_animation(clips: Tensor, rows: int, path: Path, scale: int = 4, gap: int = 1) -> None:
    """Write clips ``(B, F, 3, H, W)`` as one animated grid (WebP or GIF by ``path``'s suffix): its frame ``f``
    is the grid of every clip's frame ``f``."""
    from flowrl.utils.video import write_animation

    frames = torch.stack([image_grid(clips[:, f], rows, gap) for f in range(clips.shape[1])])
    write_animation(frames, path, scale=scale)


CONDITIONS = "conditions.json"  # beside the samples: each prompt's condition images (a conditioned run only)


class SamplePrompts(list[str]):
    """A sample row's prompts, with what each of their condition images means (the base's ConditionSpec: "the
    source image"), for :func:`write_grid`'s ``conditions.json``; a list of the prompts otherwise."""

    def __init__(self, prompts: Sequence[str], meaning: Sequence[str] = ()) -> None:
        super().__init__(prompts)
        self.meaning = tuple(meaning)


def write_grid(grid: tuple[Tensor, list[str]], file: Path) -> None:
    """Write a row of sample images and, beside it, ``prompts.txt`` with their prompts (one per line); for clips
    also the animated row beside the PNG (the same name, ``.webp``). Where the prompts carry condition images
    (an edit's source), also those (:func:`write_conditions`); a text-to-image row writes nothing more."""
    images, prompts = grid
    file.parent.mkdir(parents=True, exist_ok=True)
    save_grid_png(images, rows=1, path=file)
    if is_clip(images):
        save_grid_animation(images, rows=1, path=file.with_suffix(".webp"))
    (file.parent / "prompts.txt").write_text("".join(p + "\n" for p in prompts), encoding="utf-8")
    if any(conditions_of(p) for p in prompts):
        write_conditions(prompts, file.parent, getattr(prompts, "meaning", ()))


def write_conditions(prompts: Sequence[str], folder: Path, meaning: Sequence[str] = ()) -> None:
    """Each prompt's condition images as PNGs of their own pixels, ``conditions/<prompt>-<image>.png`` (both
    counted from 1, prompts in ``prompts.txt`` order), and ``conditions.json``: ``{"meaning": [...] (what each
    position is, from the base's ConditionSpec; may be empty), "prompts": [[file, ...], ...]}`` with the files
    relative to ``folder``. The held-out prompts are fixed, so a file already holding the same image is left
    as it is."""
    import io

    from PIL import Image

    files: list[list[str]] = []
    for i, prompt in enumerate(prompts, 1):
        files.append([])
        for j, condition in enumerate(conditions_of(prompt), 1):
            name = f"conditions/{i}-{j}.png"
            pixels = condition.pixels if condition.mode != "L" else condition.pixels[:, :, 0]
            buffer = io.BytesIO()
            Image.fromarray(pixels, condition.mode).save(buffer, format="PNG")
            target = folder / name
            if not target.is_file() or target.read_bytes() != buffer.getvalue():
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(buffer.getvalue())
            files[-1].append(name)
    manifest = json.dumps({"meaning": list(meaning), "prompts": files}, indent=1) + "\n"
    (folder / CONDITIONS).write_text(manifest, encoding="utf-8")
