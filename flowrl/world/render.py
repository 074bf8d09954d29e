"""A seeded renderer for :class:`~flowrl.world.grammar.Scene`: anti-aliased shapes on a plain background.

Objects are 7-13 px at 32 px (scaled with ``size``), axis-aligned (triangles point up), never overlap
and keep a gap of at least 3 px (bounding boxes) from each other and 1 px from the border. A relation is
drawn with a clear margin: the two boxes are separated by the gap along the relation's axis and the
centres' offset along the other axis is at most half their offset along it. Backgrounds are dark or
light low-saturation greys with a mild tint and gradient, far (RGB distance > 120) from every object
colour. Object colours are jittered by up to 12 per channel.

With a :class:`Lattice` (cells of e.g. 4 px at 32 px, the world model's token size) objects are square,
a whole number of cells wide (2 or 3 by default), and sit on the cells, so every token of an image holds
one of a few shape fragments; the gap between objects is then at least one cell and objects may touch
the border.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np
from PIL import Image, ImageDraw

from flowrl.world.grammar import COLOURS, RELATION_AXES, Scene

SUPERSAMPLE = 4
GAP = 3.0  # px at size 32, between object boxes
MARGIN = 1.0  # px at size 32, from the image border
COLOUR_JITTER = 12.0

Box = tuple[float, float, float, float]  # x0, y0, w, h (pixels)


def background(rng: np.random.Generator, size: int = 32, flat: Sequence[float] = ()) -> np.ndarray:
    """A float32 ``(size, size, 3)`` background in [0, 255]: a dark or light tinted grey with a gradient, or
    with ``flat`` levels a plain grey of one of them (drawn uniformly)."""
    if flat:
        return np.full((size, size, 3), float(flat[int(rng.integers(len(flat)))]), dtype=np.float32)
    base = rng.uniform(15.0, 75.0) if rng.random() < 0.5 else rng.uniform(150.0, 215.0)
    tint = rng.uniform(-12.0, 12.0, size=3)
    amp = rng.uniform(0.0, 24.0)
    theta = rng.uniform(0.0, 2 * np.pi)
    coords = (np.arange(size, dtype=np.float32) + 0.5) / size - 0.5
    ramp = amp * (np.cos(theta) * coords[None, :] + np.sin(theta) * coords[:, None])
    return (base + ramp[:, :, None] + tint[None, None, :]).astype(np.float32)


def _object_size(shape: str, rng: np.random.Generator, scale: float) -> tuple[float, float]:
    """Width and height of one object, in pixels."""
    if shape == "circle":
        d = rng.uniform(7.5, 13.0)
        return d * scale, d * scale
    if shape == "square":
        s = rng.uniform(7.0, 12.0)
        return s * scale, s * scale
    w = rng.uniform(8.0, 13.5)
    return w * scale, w * rng.uniform(0.8, 1.0) * scale


@attrs.frozen
class Lattice:
    """Objects on square cells of ``cell`` pixels (at 32 px), each ``cells[0]``-``cells[1]`` cells wide."""

    cell: float
    cells: tuple[int, int] = (2, 3)

    def object_size(self, rng: np.random.Generator, scale: float, smallest: bool) -> tuple[float, float]:
        """Width and height of one object in pixels (``smallest``: the fewest cells)."""
        k = self.cells[0] if smallest else int(rng.integers(self.cells[0], self.cells[1] + 1))
        return k * self.cell * scale, k * self.cell * scale


def _separated(a: Box, b: Box, gap: float) -> bool:
    """Whether boxes ``a`` and ``b`` are at least ``gap`` apart along x or along y."""
    return (
        a[0] + a[2] + gap <= b[0]
        or b[0] + b[2] + gap <= a[0]
        or a[1] + a[3] + gap <= b[1]
        or b[1] + b[3] + gap <= a[1]
    )


def relation_holds(relation: str, subject: Box, obj: Box, gap: float) -> bool:
    """The renderer's (strict) form of a relation between two boxes."""
    axis, sign = RELATION_AXES[relation]
    cs = (subject[0] + subject[2] / 2, subject[1] + subject[3] / 2)
    co = (obj[0] + obj[2] / 2, obj[1] + obj[3] / 2)
    d_axis = sign * (co[axis] - cs[axis])
    d_other = abs(co[1 - axis] - cs[1 - axis])
    first, second = (subject, obj) if sign > 0 else (obj, subject)
    apart = first[axis] + first[axis + 2] + gap <= second[axis]
    return apart and d_other <= 0.5 * d_axis


def layout(
    scene: Scene, rng: np.random.Generator, size: int = 32, lattice: Lattice | None = None
) -> list[tuple[str, str, Box]]:
    """Place every object of ``scene``: a list of (colour, shape, box) in group order."""
    scale = size / 32.0
    gap, margin = GAP * scale, MARGIN * scale
    cell = lattice.cell * scale if lattice else 0.0
    objects = [(g.colour, g.shape) for g in scene.groups for _ in range(g.count)]
    shrink = 1.0
    while True:
        if lattice:  # a retry uses the smallest size
            sizes = [lattice.object_size(rng, scale, smallest=shrink < 1) for _ in objects]
        else:
            sizes = [_object_size(shape, rng, scale * shrink) for _, shape in objects]
        for _ in range(200):
            boxes: list[Box] = []
            for w, h in sizes:
                if lattice:
                    x0 = cell * float(rng.integers(0, round((size - w) / cell) + 1))
                    y0 = cell * float(rng.integers(0, round((size - h) / cell) + 1))
                else:
                    x0 = float(rng.uniform(margin, size - margin - w))
                    y0 = float(rng.uniform(margin, size - margin - h))
                box = (float(x0), float(y0), float(w), float(h))
                if not all(_separated(box, other, gap) for other in boxes):
                    break
                boxes.append(box)
            else:
                rel = scene.relation
                if rel is None or relation_holds(rel.relation, boxes[rel.subject], boxes[rel.object], gap):
                    return [(c, s, b) for (c, s), b in zip(objects, boxes, strict=True)]
        shrink *= 0.9  # rarely needed: retry with smaller objects


def coverage(shape: str, box: Box, size: int) -> np.ndarray:
    """Anti-aliased float32 ``(size, size)`` coverage in [0, 1] of one shape filling ``box``."""
    ss = SUPERSAMPLE
    x0, y0, w, h = (v * ss for v in box)
    x1, y1 = x0 + w - 1, y0 + h - 1
    canvas = Image.new("L", (size * ss, size * ss), 0)
    draw = ImageDraw.Draw(canvas)
    if shape == "circle":
        draw.ellipse((x0, y0, x1, y1), fill=255)
    elif shape == "square":
        draw.rectangle((round(x0), round(y0), round(x1), round(y1)), fill=255)
    else:
        draw.polygon([(x0 + (w - 1) / 2, y0), (x1, y1), (x0, y1)], fill=255)
    big = np.asarray(canvas, dtype=np.float32).reshape(size, ss, size, ss)
    return big.mean(axis=(1, 3)) / 255.0


def render(
    scene: Scene,
    rng: np.random.Generator,
    size: int = 32,
    lattice: Lattice | None = None,
    flat: Sequence[float] = (),
) -> np.ndarray:
    """Render ``scene`` as a uint8 ``(size, size, 3)`` image (``lattice``: objects on cells, see above;
    ``flat``: plain grey backgrounds of these levels, see :func:`background`)."""
    img = background(rng, size, flat)
    for colour, shape, box in layout(scene, rng, size, lattice):
        img = paint(img, object_rgb(colour, rng), shape, box)
    return finish(img)


def object_rgb(colour: str, rng: np.random.Generator) -> np.ndarray:
    """One object's colour: the named colour jittered by up to :data:`COLOUR_JITTER` per channel."""
    return np.asarray(COLOURS[colour], dtype=np.float32) + rng.uniform(-COLOUR_JITTER, COLOUR_JITTER, 3)


def paint(img: np.ndarray, rgb: np.ndarray, shape: str, box: Box) -> np.ndarray:
    """``img`` (float ``(size, size, 3)``) with one anti-aliased shape of colour ``rgb`` blended in over ``box``."""
    alpha = coverage(shape, box, img.shape[0])[:, :, None]
    return img * (1.0 - alpha) + rgb.astype(np.float32) * alpha  # type: ignore[no-any-return]


def finish(img: np.ndarray) -> np.ndarray:
    """A painted float image as uint8."""
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def render_batch(
    scenes: Sequence[Scene],
    seed: int,
    size: int = 32,
    start: int = 0,
    lattice: Lattice | None = None,
    flat: Sequence[float] = (),
) -> np.ndarray:
    """Render a batch as uint8 ``(B, size, size, 3)``; image ``i`` depends only on ``seed, start + i, scenes[i]``
    (so a batch rendered in parts, each with its ``start``, equals the batch rendered at once)."""
    out = np.empty((len(scenes), size, size, 3), dtype=np.uint8)
    for i, scene in enumerate(scenes):
        out[i] = render(scene, np.random.default_rng((seed, start + i)), size, lattice, flat)
    return out
