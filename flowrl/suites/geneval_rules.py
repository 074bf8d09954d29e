"""GenEval's scoring rules, re-derived from its published evaluation: whether one image meets one prompt's
clauses, given the objects a detector found in it.

A prompt's metadata has ``include`` clauses (``class``, ``count``, optional ``color``, optional
``position = [relation, index of another include clause]``) and ``exclude`` clauses (``class``, ``count``).
Detections are kept per class: those scoring above the threshold (0.9 for every class in a ``counting``
prompt, else 0.3), most confident first, at most 16; the greedy suppression of boxes overlapping a kept one
(IoU with the +1 pixel area convention) is off at GenEval's overlap setting of 1, so all of them are kept,
duplicates too.

An image is correct when every clause holds:
- include: at least ``count`` kept objects of the class; the ``count`` most confident are *the* objects;
- colour: each of those objects' colour (the detector's colour classifier) is the clause's;
- position: each of those objects stands in the relation to each object the other clause matched
  (:func:`relative_position`); a clause whose target failed fails too;
- exclude: fewer than ``count`` kept objects of the class (so a counting prompt needs exactly N).

Per tag the accuracy is the share of correct images, and the GenEval score the plain mean of the tags'.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

THRESHOLD = 0.3
COUNTING_THRESHOLD = 0.9
MAX_OBJECTS = 16
MAX_OVERLAP = 1.0
POSITION_THRESHOLD = 0.1
TAGS = ("single_object", "two_object", "counting", "colors", "position", "color_attr")


@attrs.frozen
class Detected:
    """One detected object: its class, box ``(x1, y1, x2, y2)`` in pixels, confidence and classified colour."""

    label: str
    box: tuple[float, float, float, float]
    score: float = 1.0
    color: str | None = None

    @staticmethod
    def from_dict(row: Mapping[str, Any]) -> Detected:
        box = tuple(float(v) for v in row["box"])
        if len(box) != 4:
            raise ValueError(f"a box has 4 numbers, got {row['box']!r}")
        color = row.get("color")
        return Detected(str(row["label"]), box, float(row.get("score", 1.0)), None if color is None else str(color))  # type: ignore[arg-type]


def _iou(a: Detected, b: Detected) -> float:
    ax1, ay1, ax2, ay2 = a.box
    bx1, by1, bx2, by2 = b.box
    w, h = min(ax2, bx2) - max(ax1, bx1) + 1, min(ay2, by2) - max(ay1, by1) + 1
    inter = max(w, 0.0) * max(h, 0.0)
    area_a = (ax2 - ax1 + 1) * (ay2 - ay1 + 1)
    area_b = (bx2 - bx1 + 1) * (by2 - by1 + 1)
    return inter / (area_a + area_b - inter)


def kept(detections: Sequence[Detected], tag: str) -> dict[str, list[Detected]]:
    """The detections the rules see, per class, most confident first."""
    threshold = COUNTING_THRESHOLD if tag == "counting" else THRESHOLD
    out: dict[str, list[Detected]] = {}
    for label in dict.fromkeys(d.label for d in detections):
        ranked = sorted((d for d in detections if d.label == label and d.score > threshold), key=lambda d: -d.score)
        chosen: list[Detected] = []
        for d in ranked[:MAX_OBJECTS]:
            if MAX_OVERLAP >= 1 or all(_iou(d, k) < MAX_OVERLAP for k in chosen):  # at 1, suppression is off
                chosen.append(d)
        if chosen:
            out[label] = chosen
    return out


def relative_position(a: Detected, b: Detected) -> set[str]:
    """The relations in which ``a`` stands to ``b``: the offset of their centres, each axis shrunk by 0.1 of the
    two boxes' summed extent along it, over the unshrunk distance; a component past 0.5 names a relation (y grows
    downwards, so "above" is a negative y). Boxes too close on both axes stand in none."""
    (ax1, ay1, ax2, ay2), (bx1, by1, bx2, by2) = a.box, b.box
    offset = ((ax1 + ax2) / 2 - (bx1 + bx2) / 2, (ay1 + ay2) / 2 - (by1 + by2) / 2)
    extent = ((ax2 - ax1) + (bx2 - bx1), (ay2 - ay1) + (by2 - by1))
    revised = [math.copysign(max(abs(o) - POSITION_THRESHOLD * e, 0.0), o) for o, e in zip(offset, extent, strict=True)]
    if all(abs(r) < 1e-3 for r in revised):
        return set()
    norm = math.hypot(*offset)
    dx, dy = revised[0] / norm, revised[1] / norm
    found = set()
    if dx < -0.5:
        found.add("left of")
    if dx > 0.5:
        found.add("right of")
    if dy < -0.5:
        found.add("above")
    if dy > 0.5:
        found.add("below")
    return found


def judge(detections: Sequence[Detected], meta: Mapping[str, Any]) -> tuple[bool, list[str]]:
    """Whether the image is correct for the prompt's metadata, and the reasons it is not."""
    objects = kept(detections, str(meta.get("tag", "")))
    reasons: list[str] = []
    matched: list[list[Detected] | None] = []
    for clause in meta.get("include", []):
        label, count = str(clause["class"]), int(clause["count"])
        found = objects.get(label, [])[:count]
        if len(found) < count:
            reasons.append(f"expected {label} >= {count}, found {len(found)}")
            matched.append(None)
            continue
        if clause.get("color") is not None:
            right = sum(d.color == clause["color"] for d in found)
            if right < count:
                colours = ", ".join(str(d.color) for d in found)
                reasons.append(f"expected {clause['color']} {label} >= {count}, found {right} ({colours})")
                matched.append(None)
                continue
        if clause.get("position") is not None:
            relation, target = clause["position"][0], int(clause["position"][1])
            others = matched[target] if target < len(matched) else None
            if others is None:
                reasons.append(f"no target for {label} {relation}")
                matched.append(None)
                continue
            wrong = [(a, b) for a in found for b in others if relation not in relative_position(a, b)]
            if wrong:
                reasons.append(f"expected {label} {relation} target, found {sorted(relative_position(*wrong[0]))}")
                matched.append(None)
                continue
        matched.append(found)
    for clause in meta.get("exclude", []):
        label, count = str(clause["class"]), int(clause["count"])
        if len(objects.get(label, [])) >= count:
            reasons.append(f"expected {label} < {count}, found {len(objects[label])}")
    return not reasons, reasons


def geneval_score(correct_by_tag: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """Each tag's accuracy (the share of its correct images) and ``overall``, their plain mean."""
    out = {tag: sum(values) / len(values) for tag, values in correct_by_tag.items() if len(values)}
    out_overall = sum(out.values()) / len(out) if out else math.nan
    return {**out, "overall": out_overall}
