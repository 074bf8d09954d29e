"""The edit verifier: did the result follow the instruction, and did it keep the rest of the source?

It reads only what a served edit reward receives: the source image, the instruction's words and the result. Both
images go through the world's detector (:mod:`flowrl.world.verify`); the source's objects and the instruction
(:func:`~flowrl.world.edit.parse_instruction`) give the objects the result should hold, where the kept ones
should stand, and two lists of constraints:

- **follow**, per kind: ``recolour``: the named objects now in the new colour (that many of them), none left in
  the old one; ``add``: exactly one new object, in its relation to the anchor; ``remove``: none of the named
  objects left; ``count``: the named objects exactly as many as asked; ``move``: the mover in its new relation to
  the other object.
- **no trace**: where the source showed an object the edit takes away from its place (a removed, moved or
  recoloured object; a copy a falling count drops), the result keeps no faint copy of it: the old colour's mean
  coverage over the object's source pixels (but those the result gives to another colour) stays under
  :data:`TRACE` (the detector's own floor for background noise). Without it a half-faded ghost of a moved or
  removed object (a blend of source and target at 60-70%) passed as a clean edit. A result judged from
  detections alone (:func:`check_edit` without ``maps``) is not checked for traces.
- **preserve**: every source object the edit keeps is found with its colour and shape (a recoloured object in its
  new colour) within :data:`POSITION_TOLERANCE` pixels of where it was; a count change keeps as many of the
  source's copies as it can (all of them when the count rises, the new count when it falls).

Every detected object beyond those the result should hold is *extra* (an unasked colour or shape, a blob with no
shape, one too many of a named object), as in the text-to-image verifier. ``strict`` is 1 when every constraint
is met and nothing is extra. ``score = follow x preserve`` with ``follow = met / constraints`` (the traces
count among the follow constraints) and
``preserve = max(0, met - extra) / constraints`` (1 or 0 by ``extra`` when the edit keeps nothing): an image
that copies the source follows nothing and scores 0, an image that follows the instruction but loses or moves
what it should keep, or adds clutter, loses the preservation credit, and clutter never pays.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

from flowrl.world.edit import Instruction, parse_instruction
from flowrl.world.grammar import COLOUR_NAMES, ObjectGroup
from flowrl.world.verify import RELATION_MARGIN, SOFT_FLOOR, Detection, _relation_met, analyse_batch

POSITION_TOLERANCE = 3.0  # pixels at 32 x 32: how far a kept object's centroid may move
TRACE = SOFT_FLOOR  # mean coverage of a vacated place's old colour from which a faint copy counts as left there

Pair = tuple[str, str | None]
Maps = tuple[Any, Any, Any]  # the result's colour map (H, W) and coverage (C, H, W), the source's colour map (H, W)


@attrs.frozen
class EditVerdict:
    """The edit verifier's answer: ``score`` in [0, 1], ``strict`` in {0, 1}, the named ``follow`` and
    ``preserve`` constraints, the number of extra objects and the result's detections."""

    score: float
    strict: int
    follow: tuple[tuple[str, bool], ...]
    preserve: tuple[tuple[str, bool], ...]
    extra: int
    detections: tuple[Detection, ...]

    @property
    def follow_score(self) -> float:
        """The share of the instruction's constraints met."""
        return sum(ok for _, ok in self.follow) / len(self.follow)

    @property
    def preserve_score(self) -> float:
        """The share of the kept objects found in place, less one per extra object (0 at least)."""
        if not self.preserve:
            return float(self.extra == 0)
        return max(0, sum(ok for _, ok in self.preserve) - self.extra) / len(self.preserve)


@functools.lru_cache(maxsize=4096)
def _instruction(text: str) -> Instruction:
    return parse_instruction(text)


def _name(pair: Pair) -> str:
    return f"{pair[0]} {pair[1] or 'blob'}"


def _near(found: Sequence[Detection], pair: Pair, at: tuple[float, float], tolerance: float) -> bool:
    return any(d.pair == pair and np.hypot(d.centroid[0] - at[0], d.centroid[1] - at[1]) <= tolerance for d in found)


def _source_group(source: Sequence[Detection], group: ObjectGroup, role: str) -> list[Detection]:
    """The source's objects of ``group``'s pair; a ``ValueError`` when the source does not show them as named."""
    mine = [d for d in source if d.pair == group.pair]
    if not mine or (role == "named" and len(mine) != group.count):
        shown = ", ".join(sorted(_name(d.pair) for d in source if d.shape)) or "no object"
        raise ValueError(f"the instruction names {group.text}; the source shows {shown}")
    return mine


def _trace(place: Detection, maps: Maps) -> float:
    """The old colour's mean coverage in the result over ``place``'s source pixels (those the result gives to
    another colour count as none: a recoloured object, or another object drawn over the place)."""
    result_cmap, result_cover, source_cmap = maps
    k = COLOUR_NAMES.index(place.colour)
    x0, y0, x1, y1 = place.box
    mine = source_cmap[y0 : y1 + 1, x0 : x1 + 1] == k
    there = result_cmap[y0 : y1 + 1, x0 : x1 + 1]
    free = mine & ((there < 0) | (there == k))
    return float(result_cover[k, y0 : y1 + 1, x0 : x1 + 1][free].sum() / max(int(mine.sum()), 1))


def check_edit(
    result: Sequence[Detection],
    source: Sequence[Detection],
    instruction: Instruction | str,
    size: int = 32,
    maps: Maps | None = None,
) -> EditVerdict:
    """Score a result's detections against the source's and the instruction (see the module docstring);
    ``maps`` (the result's colour map and coverage, the source's colour map) adds the trace constraints."""
    ins = _instruction(instruction) if isinstance(instruction, str) else instruction
    tolerance, margin = POSITION_TOLERANCE * size / 32.0, RELATION_MARGIN * size / 32.0
    named = ins.named.pair
    found = Counter(d.pair for d in result)
    expected = Counter(d.pair for d in source if d.shape is not None)
    follow: list[tuple[str, bool]] = []
    keep: list[tuple[Pair, tuple[float, float]]] = []  # (pair, place) of each object kept in place
    kept_at_least = 0  # a falling count: how many of the source's copies must stay
    if ins.kind == "count":
        copies = _source_group(source, ins.named, "count")
        if len(copies) <= ins.named.count:
            keep += [(named, d.centroid) for d in copies]
        else:
            kept_at_least = ins.named.count
        expected[named] = ins.named.count
        follow.append((f"{_name(named)} count == {ins.named.count}", found[named] == ins.named.count))
    elif ins.kind == "recolour":
        mine = _source_group(source, ins.named, "named")
        new = (ins.colour, ins.named.shape)
        expected[named], expected[new] = 0, expected[new] + len(mine)
        keep += [(new, d.centroid) for d in mine]
        follow.append((f"{_name(new)} count == {expected[new]}", found[new] == expected[new]))
        follow.append((f"no {_name(named)} left", found[named] == 0))
    elif ins.kind == "remove":
        _source_group(source, ins.named, "named")
        expected[named] = 0
        follow.append((f"{_name(named)} removed", found[named] == 0))
    else:  # add, move: the named object in a relation to the other
        assert ins.other is not None
        other = ins.other.pair
        _source_group(source, ins.other, "other" if ins.kind == "add" else "named")
        if ins.kind == "add":
            expected[named] += 1
            follow.append((f"{_name(named)} added", found[named] == expected[named]))
        else:
            _source_group(source, ins.named, "named")
        movers = [d for d in result if d.pair == named]
        met = _relation_met(ins.relation, movers, [d for d in result if d.pair == other], margin)
        follow.append((f"{_name(named)} {ins.relation} the {_name(other)}", met))
    if maps is not None and ins.kind != "add":  # no faint copy where an object was taken away
        vacated = [d for d in source if d.pair == named]
        if ins.kind == "count":  # a falling count: the copies the result did not keep in place
            vacated = [d for d in vacated if kept_at_least and not _near(result, named, d.centroid, tolerance)]
        follow += [
            (f"no trace of {_name(named)} at ({d.centroid[0]:.0f}, {d.centroid[1]:.0f})", _trace(d, maps) < TRACE)
            for d in vacated
        ]
    acted_on = {named} if ins.kind != "add" else set()
    keep += [(d.pair, d.centroid) for d in source if d.shape is not None and d.pair not in acted_on]
    preserve = [(f"{_name(p)} kept at ({at[0]:.0f}, {at[1]:.0f})", _near(result, p, at, tolerance)) for p, at in keep]
    if kept_at_least:
        places = sum(_near(result, named, d.centroid, tolerance) for d in source if d.pair == named)
        preserve += [
            (f"{_name(named)} {i + 1} of {kept_at_least} kept in place", places > i) for i in range(kept_at_least)
        ]
    extra = len(result) - sum(min(n, expected[pair]) for pair, n in found.items())
    met_all = all(ok for _, ok in follow) and all(ok for _, ok in preserve)
    verdict = EditVerdict(0.0, int(met_all and extra == 0), tuple(follow), tuple(preserve), extra, tuple(result))
    return attrs.evolve(verdict, score=verdict.follow_score * verdict.preserve_score)


def verify_edit(result: Any, source: Any, instruction: Instruction | str) -> EditVerdict:
    """Verify one result image against its source image and instruction (images as
    :func:`~flowrl.world.verify.verify` takes them)."""
    return verify_edit_batch(np.asarray(result)[None], np.asarray(source)[None], [instruction])[0]


def verify_edit_batch(results: Any, sources: Any, instructions: Sequence[Instruction | str]) -> list[EditVerdict]:
    """One :class:`EditVerdict` per result of a batch; ``results`` and ``sources`` are batches as
    :func:`~flowrl.world.verify.verify_batch` takes them (a torch tensor ``(B, 3, H, W)`` in [0, 1], or
    ``(B, H, W, 3)`` uint8), each detected in batched passes."""
    found, size, (cmaps, covers) = analyse_batch(results, len(instructions))
    shown, _, (source_cmaps, _) = analyse_batch(sources, len(instructions))
    return [
        check_edit(r, s, i, size, (cmaps[b], covers[b], source_cmaps[b]))
        for b, (r, s, i) in enumerate(zip(found, shown, instructions, strict=True))
    ]


def score_edit_batch(
    results: Any, sources: Any, instructions: Sequence[Instruction | str]
) -> tuple[np.ndarray, np.ndarray]:
    """Scores and strict flags (both float32 ``(B,)``) of a batch (as :func:`verify_edit_batch` takes it)."""
    verdicts = verify_edit_batch(results, sources, instructions)
    return (
        np.asarray([v.score for v in verdicts], dtype=np.float32),
        np.asarray([v.strict for v in verdicts], dtype=np.float32),
    )
