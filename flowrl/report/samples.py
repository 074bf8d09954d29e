"""The report's held-out samples: the strips the trainer writes at each evaluation (``samples/step_*.png``, one
tile per prompt in ``samples/prompts.txt`` order, 1-pixel gutters before the 4x upscale) cut into their tiles
and laid out as a table: one row per evaluation, one column per prompt, the prompt heading its column. A
video run's strip has an animated twin (``.webp``): each clip is cut from it frame by frame, so a row is a
row of captioned clips.

A run whose prompts carry condition images (an edit's source) keeps them beside the strips
(``samples/conditions.json`` and ``samples/conditions/``, written by :func:`flowrl.trainer.logger.write_conditions`):
then each tile shows the prompt's condition images and the result side by side (source | result), the prompt (the
instruction) as its caption. A run without that file is laid out as above, unchanged.
"""

from __future__ import annotations

import html
import io
import json
from collections.abc import Callable
from pathlib import Path

MAX_GRIDS = 12  # evaluations shown, spread over the run (first and last always)
SCALE, GAP = 4, 1  # how flowrl.trainer.logger.save_grid_png writes a strip
EDIT_STYLE = """
table.samples figure.edit { margin: 0; display: flex; flex-wrap: wrap; align-items: center; width: 140px; }
table.samples figure.edit img { width: 64px; }
table.samples figure.edit .arrow { width: 12px; text-align: center; font-size: 11px; color: #888; }
table.samples figure.edit figcaption { width: 100%; font-size: 10px; color: #555; }
"""  # a conditioned run's tiles (the page adds it only then: a text-to-image page stays as it was)


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


def sample_prompts(run_dir: Path) -> list[str]:
    """The prompts of the strips' tiles, in order (``samples/prompts.txt``; none when it is missing)."""
    listed = run_dir / "samples" / "prompts.txt"
    return [line for line in listed.read_text(encoding="utf-8").splitlines() if line] if listed.is_file() else []


def conditioned(run_dir: Path) -> bool:
    """The run's samples come with their prompts' condition images (its tiles show source | result)."""
    prompts = sample_prompts(run_dir)
    return bool(prompts) and condition_files(run_dir, len(prompts)) is not None


def condition_files(run_dir: Path, count: int) -> tuple[list[list[Path]], tuple[str, ...]] | None:
    """Each of the ``count`` prompts' condition image files and what each position means, from
    ``samples/conditions.json``; None for a run without it (text-to-image) or one that does not match the prompts."""
    folder = run_dir / "samples"
    try:
        manifest = json.loads((folder / "conditions.json").read_text(encoding="utf-8"))
        names = [[str(name) for name in row] for row in manifest["prompts"]]
        files = [[folder / name for name in row if not Path(name).is_absolute() and ".." not in Path(name).parts]
                 for row in names]
        meaning = tuple(str(m) for m in manifest.get("meaning", ()))
    except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError):
        return None
    if len(files) != count or files != [[folder / n for n in row] for row in names] or not any(files) \
            or not all(f.is_file() for row in files for f in row):
        return None
    return files, meaning


def _named(meaning: tuple[str, ...], k: int) -> str:
    """What the ``k``-th condition image is (the base's word for it, else "condition image")."""
    return meaning[k] if k < len(meaning) else "condition image"


def _edit_cell(files: list[Path], meaning: tuple[str, ...], result: str, prompt: str,
               image: Callable[[bytes, str, str], str]) -> str:
    """One tile of a conditioned run: the condition images | the result, the prompt as the caption."""
    shown = "".join(image(f.read_bytes(), f"{_named(meaning, k)}: {prompt}", "png") for k, f in enumerate(files))
    return (f'<figure class="edit">{shown}<span class="arrow">&rarr;</span>{result}'
            f"<figcaption>{html.escape(prompt)}</figcaption></figure>")


def _source_row(conditions: tuple[list[list[Path]], tuple[str, ...]], prompts: list[str],
                image: Callable[[bytes, str, str], str]) -> str:
    """A table row of each prompt's condition images, for strips that are shown whole."""
    files, meaning = conditions
    cells = "".join("<td>" + "".join(image(f.read_bytes(), f"{_named(meaning, k)}: {p}", "png")
                                     for k, f in enumerate(row)) + "</td>"
                    for row, p in zip(files, prompts, strict=True))
    return f"<tr><th>{html.escape(_named(meaning, 0))}</th>{cells}</tr>"


def sample_table(run_dir: Path, image: Callable[[bytes, str, str], str]) -> list[str]:
    """HTML lines of the samples section; ``image(data, alt, format)`` makes an inline ``<img>``."""
    grids = sample_grids(run_dir)
    parts = ["<h2>Held-out samples over the run</h2>"]
    if not grids:
        return [*parts, "<p>None written (they are saved at each evaluation when trainer.image_every &gt; 0).</p>"]
    prompts = sample_prompts(run_dir)
    conditions = condition_files(run_dir, len(prompts)) if prompts else None
    if conditions is None:
        parts.append("<p>Deterministic ODE samples from the same noise at each evaluation: a row per evaluation, the "
                     "prompt above its column.</p>")
    else:
        what = html.escape(", ".join(dict.fromkeys(conditions[1])) or "condition images")
        parts.append("<p>Deterministic ODE samples from the same noise at each evaluation: a row per evaluation, the "
                     f"prompt above its column; each tile shows {what} and the result side by side (source | "
                     "result), the prompt below them.</p>")
    parts.append('<table class="samples"><tr><th></th>'
                 + "".join(f'<th class="prompt">{html.escape(p)}</th>' for p in prompts) + "</tr>")
    rows = []
    for step, path in grids:
        animated = path.with_suffix(".webp")
        rows.append((step, path, _cut(animated if animated.is_file() else path, len(prompts)) if prompts else None))
    if conditions is not None and any(tiles is None for _, _, tiles in rows):  # a strip shown whole: the sources
        parts.append(_source_row(conditions, prompts, image))  # once, above the rows
    for step, path, tiles in rows:
        if tiles is None:  # not cut into tiles: the strip whole, under the prompts
            cells = f'<td colspan="{max(1, len(prompts))}">{image(path.read_bytes(), f"samples at {step}", "png")}</td>'
        elif conditions is not None:
            cells = "".join(
                f"<td>{_edit_cell(files, conditions[1], image(data, f'{p} at iteration {step}', kind), p, image)}</td>"
                for (data, kind), p, files in zip(tiles, prompts, conditions[0], strict=True))
        else:
            cells = "".join(f"<td>{image(data, f'{prompt} at iteration {step}', kind)}</td>"
                            for (data, kind), prompt in zip(tiles, prompts, strict=True))
        parts.append(f"<tr><th>iteration {step}</th>{cells}</tr>")
    parts.append("</table>")
    return parts
