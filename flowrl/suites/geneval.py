"""The GenEval suite: 553 prompts in six tags, four images each, judged by GenEval's rules
(:mod:`flowrl.suites.geneval_rules`) on the objects a detector finds.

The official detector (Mask2Former under mmdet/mmcv, with CLIP ViT-L/14 classifying each object's colour) needs
an environment of its own; it runs as a server there and flowrl calls it: ``POST URL/detect`` with the images
(flowrl's wire format, ``{"images": [...], "prompts": [...]}``) answers ``{"detections": [[{"label", "box",
"score", "color"}, ...], ...]}``, one list per image, every detection above 0.3 with its colour (docs/evaluation.md
has the contract and the setup). ``detector = "world"`` uses the embedded world's own detector (shapes and
colours; for tests and the world's prompts), ``"module:function"`` one of your own (images, items -> lists).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np
from torch import Tensor

from flowrl.core.errors import UserError
from flowrl.core.registry import register
from flowrl.suites.geneval_rules import TAGS, Detected, judge
from flowrl.suites.interface import Item, Suite, finite_mean, named_function
from flowrl.suites.prompt_sets import suite_items
from flowrl.suites.protocol import Protocol

Detector = Callable[[Tensor, Sequence[Item]], list[list[Detected]]]


def world_detector(images: Tensor, items: Sequence[Item]) -> list[list[Detected]]:
    """The embedded world's detector as GenEval's: each object's shape is its class, its colour classified, its
    confidence 1."""
    from flowrl.world.verify import detect

    out = []
    for image in images:
        found = [Detected(d.shape, tuple(float(v) for v in d.box), 1.0, d.colour)  # type: ignore[arg-type]
                 for d in detect(image) if d.shape is not None]
        out.append(found)
    return out


def served_detector(url: str, timeout_s: float = 600.0) -> Detector:
    from flowrl.rewards.http import Endpoint
    from flowrl.rewards.wire import encode_image

    endpoint = Endpoint(url, timeout_s, retries=2, backoff_s=2.0)

    def detect(images: Tensor, items: Sequence[Item]) -> list[list[Detected]]:
        body = {"images": [encode_image(image, "png") for image in images], "prompts": [i.prompt for i in items]}
        answer = endpoint.post("/detect", body)
        rows = answer.get("detections") if isinstance(answer, dict) else None
        if not isinstance(rows, list) or len(rows) != len(items):
            raise UserError(f"detector {url}/detect answered without one detection list per image")
        try:
            return [[Detected.from_dict(d) for d in row] for row in rows]
        except (KeyError, TypeError, ValueError) as error:
            raise UserError(f"detector {url}/detect answered a malformed detection ({error})") from None

    return detect


def resolve_detector(name: str) -> Detector:
    if name == "world":
        return world_detector
    if name.startswith(("http://", "https://")):
        return served_detector(name)
    if ":" in name:
        return named_function(name, "suite geneval: detector")  # type: ignore[no-any-return]
    raise UserError("suite geneval needs a detector: detector = \"http://HOST:PORT\" (the served official one, "
                    "docs/evaluation.md), \"world\", or \"module:function\"")


@register("suite", "geneval")
class GenEvalSuite(Suite):
    """GenEval: 553 prompts, 4 images each, GenEval's rules on a detector's objects; accuracy per tag, their mean."""

    primary = "overall"
    fractions = ("correct",)
    source = "djghosh13/geneval prompts/evaluation_metadata.jsonl and evaluation/ (rules re-derived)"

    scoring = ("detector",)

    @attrs.frozen
    class Config:
        prompts: str = ""  # a metadata file of your own (.jsonl: prompt, tag, include, exclude); default: fetched
        detector: str = ""  # "http://HOST:PORT" (served), "world", or "module:function"

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self._detector: Detector | None = None

    def protocol(self) -> Protocol:
        # Flow-GRPO's GenEval setting for SD3.5-M: 512 px, 40 steps, guidance 4.5, 4 images a prompt
        return Protocol(steps=40, images=4, seed=0, guidance=4.5, resolution=512)

    def items(self) -> list[Item]:
        items = suite_items(self.config.prompts, "geneval")
        return [Item(i.prompt, str(i.meta.get("tag", i.category)), i.meta) for i in items]

    def check(self) -> None:
        self._detector = self._detector or resolve_detector(self.config.detector)

    def headline(self) -> dict[str, Any]:
        return {"figure": "overall", "of": "correct", "by": "category", "scale": 1.0}  # GenEval's: the mean over tags

    def scorer_problems(self, scoring: dict[str, Any]) -> list[str]:
        detector = str(scoring.get("detector", self.config.detector))
        if detector.startswith(("http://", "https://")):
            return []  # the served official detector (docs/evaluation.md): flowrl cannot see behind the URL
        return [f"detector {detector!r} is not GenEval's own (the served Mask2Former detector)"]

    def score(self, images: Tensor, items: Sequence[Item]) -> list[dict[str, float]]:
        self.check()
        assert self._detector is not None
        found = self._detector(images, items)
        return [{"correct": float(judge(d, {**item.meta, "tag": item.category})[0])}
                for d, item in zip(found, items, strict=True)]

    def aggregate(self, figures: Sequence[dict[str, float]], items: Sequence[Item]) -> dict[str, float]:
        """Each tag's accuracy (over its prompts' images) and ``overall``, the plain mean over the tags present."""
        correct = np.asarray([f["correct"] for f in figures], dtype=np.float64)
        tags = [t for t in TAGS if any(i.category == t for i in items)]
        tags += sorted({i.category for i in items} - set(TAGS))
        out = {tag: finite_mean(correct[np.asarray([i.category == tag for i in items])]) for tag in tags}
        return {"overall": float(np.mean(list(out.values()))) if out else float("nan"), **out}


def world_metadata(text: str) -> dict[str, Any]:
    """GenEval metadata for a prompt of the embedded world (shapes as classes, colours named), the way GenEval
    states the same constraint: a single object as a ``colors`` prompt, a count as ``counting`` (exactly N),
    two objects as ``color_attr``, a relation as ``position`` (the first-named object's clause points at the
    other's). Like GenEval's own prompts, two objects must be of two classes (shapes) for the rules to hold: they
    check a class's most confident objects only."""
    from flowrl.world.grammar import parse

    scene = parse(text)
    clauses = [{"class": g.shape, "count": g.count, "color": g.colour} for g in scene.groups]
    if scene.kind == "single":
        return {"tag": "colors", "include": clauses}
    if scene.kind == "count":
        return {"tag": "counting", "include": clauses, "exclude": [{"class": g.shape, "count": g.count + 1}
                                                                   for g in scene.groups]}
    if scene.kind == "pair":
        return {"tag": "color_attr", "include": clauses}
    assert scene.relation is not None
    subject, target = clauses
    return {"tag": "position", "include": [target, {**subject, "position": [scene.relation.relation, 0]}]}
