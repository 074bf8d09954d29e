"""Draw an edit as a pair of images: the source scene, and the target scene with everything the edit keeps in place.

Both images share the background and every kept object's place and colour jitter (they are identical outside the
edited objects): a recoloured object keeps its place and jitter with the new colour; a removed object, or the
copies a count change drops (the last ones), vanish; an added object, the copies a count change adds, and a moved
object (with its jitter) go to a free place (the renderer's spacing from every other object) where the target's
relation holds in the renderer's strict form. When the source's layout leaves no such place (an anchor at the
border for "left of" it), the pair is drawn again from the same generator, so a pair depends only on it.

:data:`WORLD_LATTICE` and :data:`WORLD_BACKGROUND` are how the world's base models draw (one object per 8-pixel
cell at 32 px, a plain grey of 60): the edit world's defaults.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from flowrl.world.edit import Edit
from flowrl.world.render import (
    GAP,
    MARGIN,
    Box,
    Lattice,
    _object_size,
    _separated,
    background,
    finish,
    layout,
    object_rgb,
    paint,
    relation_holds,
)

WORLD_LATTICE = Lattice(8.0, (1, 1))
WORLD_BACKGROUND: tuple[float, ...] = (60.0,)
ATTEMPTS = 200  # source layouts tried before an edit is declared impossible to draw

Placed = tuple[str, str, Box, np.ndarray]  # colour, shape, box, rgb (jittered)


def _place(
    shape: str,
    others: Sequence[Box],
    rng: np.random.Generator,
    size: int,
    lattice: Lattice | None,
    holds: Callable[[Box], bool],
) -> Box | None:
    """A box for one new object, apart from ``others`` and where ``holds``; None when none is found. On a lattice
    every cell is tried (one drawn among those that fit); without one, 200 random places."""
    scale = size / 32.0
    gap = GAP * scale

    def fits(box: Box) -> bool:
        return all(_separated(box, o, gap) for o in others) and holds(box)

    if lattice is not None:
        w, h = lattice.object_size(rng, scale, smallest=False)
        cell = lattice.cell * scale
        steps = round((size - w) / cell) + 1
        boxes = [(cell * i, cell * j, w, h) for j in range(steps) for i in range(steps)]
        fitting = [b for b in boxes if fits(b)]
        return fitting[int(rng.integers(len(fitting)))] if fitting else None
    w, h = _object_size(shape, rng, scale)
    margin = MARGIN * scale
    for _ in range(200):
        box = (float(rng.uniform(margin, size - margin - w)), float(rng.uniform(margin, size - margin - h)), w, h)
        if fits(box):
            return box
    return None


def _target(
    edit: Edit, source: list[Placed], rng: np.random.Generator, size: int, lattice: Lattice | None
) -> list[Placed] | None:
    """The target's objects from the source's (group order), or None when the edit does not fit this layout."""
    gap = GAP * size / 32.0
    counts = [g.count for g in edit.source.groups]
    first = sum(counts[: edit.group])
    mine = source[first : first + counts[edit.group]]  # the objects of the group the edit acts on
    rest = source[:first] + source[first + counts[edit.group] :]
    if edit.kind == "recolour":
        mine_at = range(first, first + counts[edit.group])
        return [
            (edit.colour, s, b, object_rgb(edit.colour, rng)) if i in mine_at else (c, s, b, j)
            for i, (c, s, b, j) in enumerate(source)
        ]
    if edit.kind == "remove":
        return rest
    if edit.kind == "count":
        kept = mine[: edit.count]
        colour, shape = edit.named.pair
        while len(kept) < edit.count:
            box = _place(shape, [p[2] for p in kept], rng, size, lattice, lambda b: True)
            if box is None:
                return None
            kept.append((colour, shape, box, object_rgb(colour, rng)))
        return kept
    if edit.kind == "add":
        assert edit.added is not None
        anchor = source[0][2]
        box = _place(
            edit.added.shape, [anchor], rng, size, lattice, lambda b: relation_holds(edit.relation, b, anchor, gap)
        )
        if box is None:
            return None
        return [(*edit.added.pair, box, object_rgb(edit.added.colour, rng)), *source]
    # move: the mover (one object) goes where it stands in the new relation to the other
    (colour, shape, _, rgb), other = mine[0], rest[0][2]
    box = _place(shape, [other], rng, size, lattice, lambda b: relation_holds(edit.relation, b, other, gap))
    if box is None:
        return None
    moved = (colour, shape, box, rgb)
    return [moved, rest[0]] if edit.group == 0 else [rest[0], moved]


def render_edit(
    edit: Edit,
    rng: np.random.Generator,
    size: int = 32,
    lattice: Lattice | None = WORLD_LATTICE,
    flat: Sequence[float] = WORLD_BACKGROUND,
) -> tuple[np.ndarray, np.ndarray]:
    """The source and target images of ``edit``, each uint8 ``(size, size, 3)`` (see the module docstring)."""
    for _ in range(ATTEMPTS):
        bg = background(rng, size, flat)
        source = [(c, s, b, object_rgb(c, rng)) for c, s, b in layout(edit.source, rng, size, lattice)]
        target = _target(edit, source, rng, size, lattice)
        if target is not None:
            return _paint(bg, source), _paint(bg, target)
    raise ValueError(f"edit {edit.text!r} of {edit.source.text!r} does not fit a {size} px image here")


def _paint(bg: np.ndarray, objects: Sequence[Placed]) -> np.ndarray:
    img = bg
    for _, shape, box, rgb in objects:
        img = paint(img, rgb, shape, box)
    return finish(img)


def render_edit_batch(
    edits: Sequence[Edit],
    seed: int,
    size: int = 32,
    start: int = 0,
    lattice: Lattice | None = WORLD_LATTICE,
    flat: Sequence[float] = WORLD_BACKGROUND,
) -> tuple[np.ndarray, np.ndarray]:
    """Sources and targets as uint8 ``(B, size, size, 3)`` each; pair ``i`` depends only on ``seed, start + i,
    edits[i]`` (a batch drawn in parts, each with its ``start``, equals the batch drawn at once)."""
    sources = np.empty((len(edits), size, size, 3), dtype=np.uint8)
    targets = np.empty_like(sources)
    for i, edit in enumerate(edits):
        sources[i], targets[i] = render_edit(edit, np.random.default_rng((seed, start + i)), size, lattice, flat)
    return sources, targets
