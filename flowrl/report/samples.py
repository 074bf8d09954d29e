"""The report's held-out samples: the strips the trainer writes at each evaluation (``samples/step_*.png``, one
tile per prompt in ``samples/prompts.txt`` order, 1-pixel gutters before the 4x upscale) cut into their tiles
and laid out as a table: one row per evaluation, one column per prompt, the prompt heading its column. A
video run's strip has an animated twin (``.webp``): each clip is cut from it frame by frame, so a row is a
row of captioned clips.
"""

from __future__ import annotations

import html
import io
from collections.abc import Callable
from pathlib import Path

MAX_GRIDS = 12  # evaluations shown, spread over the run (first and last always)
SCALE, GAP = 4, 1  # how flowrl.trainer.logger.save_grid_png writes a strip


def sample_grids(run_dir: Path) -> list[tuple[int, Path]]:
    """``samples/step_*.png`` by step, at most :data:`MAX_GRIDS` spread evenly (first and last kept)."""
    found = []
    for path in (run_dir / "samples").glob("step_*.png"):
        suffix = path.stem.removeprefix("step_")
        if suffix.isdigit():
            found.append((int(suffix), path))
    found.sort()
    if len(found) <= MAX_GRIDS:
        return found
    picks = sorted({round(i * (len(found) - 1) / (MAX_GRIDS - 1)) for i in range(MAX_GRIDS)})
    return [found[i] for i in picks]


def tile_boxes(width: int, height: int, count: int) -> list[tuple[int, int, int, int]] | None:
    """The ``count`` tiles of a one-row strip ``width`` x ``height`` pixels, as PIL boxes; None when the strip is
    not ``count`` equal tiles with gutters (written another way: shown whole)."""
    if count < 1 or width % SCALE:
        return None
    inner = width // SCALE - (count - 1) * GAP
    if inner <= 0 or inner % count:
        return None
    tile = inner // count
    return [((k * (tile + GAP)) * SCALE, 0, (k * (tile + GAP) + tile) * SCALE, height) for k in range(count)]


def _cut(path: Path, count: int) -> list[tuple[bytes, str]] | None:
    """Each tile of ``path`` as (image bytes, its format); an animated strip's tiles stay animated."""
    from PIL import Image, ImageSequence

    with Image.open(path) as strip:
        boxes = tile_boxes(strip.width, strip.height, count)
        if boxes is None:
            return None
        animated = getattr(strip, "n_frames", 1) > 1
        frames = [frame.convert("RGB") for frame in ImageSequence.Iterator(strip)] if animated else [
            strip.convert("RGB")]
        duration = strip.info.get("duration", 200)
    tiles = []
    for box in boxes:
        buffer = io.BytesIO()
        cut = [frame.crop(box) for frame in frames]
        if animated:
            cut[0].save(buffer, format="WEBP", save_all=True, append_images=cut[1:], duration=duration, loop=0,
                        lossless=True)
            tiles.append((buffer.getvalue(), "webp"))
        else:
            cut[0].save(buffer, format="PNG")
            tiles.append((buffer.getvalue(), "png"))
    return tiles


def sample_table(run_dir: Path, image: Callable[[bytes, str, str], str]) -> list[str]:
    """HTML lines of the samples section; ``image(data, alt, format)`` makes an inline ``<img>``."""
    grids = sample_grids(run_dir)
    parts = ["<h2>Held-out samples over the run</h2>"]
    if not grids:
        return [*parts, "<p>None written (they are saved at each evaluation when trainer.image_every &gt; 0).</p>"]
    listed = run_dir / "samples" / "prompts.txt"
    prompts = [line for line in listed.read_text(encoding="utf-8").splitlines() if line] if listed.is_file() else []
    parts.append("<p>Deterministic ODE samples from the same noise at each evaluation: a row per evaluation, the "
                 "prompt above its column.</p>")
    parts.append('<table class="samples"><tr><th></th>'
                 + "".join(f'<th class="prompt">{html.escape(p)}</th>' for p in prompts) + "</tr>")
    for step, path in grids:
        animated = path.with_suffix(".webp")
        tiles = _cut(animated if animated.is_file() else path, len(prompts)) if prompts else None
        if tiles is None:  # not cut into tiles: the strip whole, under the prompts
            cells = f'<td colspan="{max(1, len(prompts))}">{image(path.read_bytes(), f"samples at {step}", "png")}</td>'
        else:
            cells = "".join(f"<td>{image(data, f'{prompt} at iteration {step}', kind)}</td>"
                            for (data, kind), prompt in zip(tiles, prompts, strict=True))
        parts.append(f"<tr><th>iteration {step}</th>{cells}</tr>")
    parts.append("</table>")
    return parts
