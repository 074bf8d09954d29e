"""T2I-CompBench++ (Huang et al., TPAMI 2025; Karine-Huang/T2I-CompBench, MIT): 300 validation prompts in each of
8 categories, 10 images a prompt, each category scored by its own published metric (re-derived here):

* ``color``, ``shape``, ``texture`` (attribute binding), BLIP-VQA: spaCy's noun phrases of the prompt (at most 8,
  leaving out "top", "the side", "the left", "the right") are each asked as a question ("a green bench?"); the
  score is the product over the phrases of the VQA model's first-token P(yes) / (P(yes) + P(no)).
* ``non_spatial``, CLIPScore: the cosine of CLIP ViT-B/32's image and prompt embeddings.
* ``complex``, 3-in-1: the mean of the attribute score, the 2D-spatial score and the CLIP score of the prompt
  without its adjectives, over the parts the prompt has (spatial relation, action relation, or both).
* ``spatial``, ``3d_spatial``, ``numeracy``: the source scores these with UniDet detections (and MiDaS depth for
  3D), which no maintained package runs. flowrl substitutes the same VQA judge, asked the whole prompt as a
  question ("a giraffe next to a lamp?", P(yes) / (P(yes) + P(no))); results are then marked not comparable.

The source's VQA model is BLIP's VQA (base, CapFilt-L; ``Salesforce/blip-vqa-capfilt-large`` on the hub): the suite
counts it as its own when it is served (``judge = "openai:URL#blip-vqa-capfilt-large"``); the judge hears the
question as the source asks it, with no instruction after it. ``parser`` finds noun phrases and adjectives:
``"spacy:en_core_web_sm"`` (the source's), or ``"module:function"`` (``function(prompt) -> {"noun_phrases": [...],
"without_adjectives": str}``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np
from torch import Tensor

from flowrl.core.errors import UserError
from flowrl.core.registry import build, register
from flowrl.suites.interface import Item, Suite, named_function, plain
from flowrl.suites.judge import Judge, resolve_judge, served_model, yes_share
from flowrl.suites.prompt_sets import suite_items
from flowrl.suites.protocol import Protocol

CATEGORIES = ("color", "shape", "texture", "spatial", "3d_spatial", "non_spatial", "complex", "numeracy")
ATTRIBUTE, DETECTED = ("color", "shape", "texture"), ("spatial", "3d_spatial", "numeracy")
SKIPPED_PHRASES = ("top", "the side", "the left", "the right")
MAX_PHRASES = 8  # BLIP_vqa.py's --np_num
BLIP = "blip-vqa-capfilt-large"
CLIP = {"type": "clipscore", "model": "openai/clip-vit-base-patch32"}  # CLIP_similarity.py: ViT-B/32, raw cosine
SUBSTITUTION = ("2D/3D spatial and numeracy (and complex's spatial part) are scored by the VQA judge asked the "
                "prompt as a question, in place of the source's UniDet detector")
Parser = Callable[[str], dict[str, Any]]


def spacy_parser(model: str) -> Parser:
    """spaCy's noun chunks and the prompt without its adjectives, as the source's scripts read them."""
    try:
        import spacy

        nlp = spacy.load(model)
    except (ImportError, OSError) as error:
        raise UserError(f"suite t2icompbench: parser spacy:{model} cannot load ({error}); install spacy and its "
                        f"{model} model, or give parser = \"module:function\"") from None

    def parse(prompt: str) -> dict[str, Any]:
        doc = nlp(prompt)
        return {"noun_phrases": [c.text for c in doc.noun_chunks],
                "without_adjectives": " ".join(t.text for t in doc if t.pos_ != "ADJ")}

    return parse


def attribute_score(judge: Judge, image: Tensor, phrases: Sequence[str]) -> float:
    """BLIP-VQA's attribute binding score: the product of each noun phrase's yes share (1 with no phrase)."""
    kept = [p for p in phrases if p not in SKIPPED_PHRASES][:MAX_PHRASES]
    return math.prod(yes_share(judge, image, f"{phrase}?") for phrase in kept)


def complex_score(parts: str, attribute: float, spatial: float, action: float) -> float:
    """3-in-1: attribute with spatial, attribute with action, or all three."""
    if parts == "spatial":
        return (attribute + spatial) / 2
    if parts == "action":
        return (attribute + action) / 2
    return (attribute + spatial + action) / 3


@register("suite", "t2icompbench")
class T2ICompBenchSuite(Suite):
    """T2I-CompBench++: 8 categories x 300 prompts x 10 images, each category's metric (UniDet's substituted)."""

    primary = "score"
    source = "Karine-Huang/T2I-CompBench examples/dataset/*_val.txt (MIT) and its metrics (re-derived)"
    scoring = ("judge", "clip", "parser")

    @attrs.frozen
    class Config:
        prompts: str = ""  # a file of your own (.jsonl: prompt, category; complex prompts: parts)
        judge: str = ""  # the VQA judge: "openai:URL#MODEL" (BLIP served), "transformers:PATH", "module:function"
        clip: dict[str, Any] = attrs.field(factory=lambda: dict(CLIP))  # a reward table: CLIPScore's model
        parser: str = "spacy:en_core_web_sm"  # or "module:function"

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self._judge: Judge | None = None
        self._parser: Parser | None = None
        self._clip: Any = None

    def protocol(self) -> Protocol:
        # the source's evaluation reads 10 images a prompt (3_in_1.py); steps, resolution and guidance are the
        # base's (flowrl's choice of 28 steps, as for the preference suites)
        return Protocol(steps=28, images=10, seed=0)

    def items(self) -> list[Item]:
        rows = suite_items(self.config.prompts, "t2icompbench")
        marks = {c: {r.prompt.split(".")[0].lower() for r in rows if r.category == f"_complex_{c}"}
                 for c in ("spatial", "action")}
        items = []
        for row in rows:
            if row.category.startswith("_"):
                continue
            if row.category not in CATEGORIES:
                raise UserError(f"T2I-CompBench prompt {row.prompt!r}: category {row.category!r} is not one of "
                                f"{', '.join(CATEGORIES)}")
            meta = dict(row.meta)
            if row.category == "complex" and "parts" not in meta:  # 3_in_1.py's lists, its first match wins
                key = row.prompt.split(".")[0].lower()
                meta["parts"] = "spatial" if key in marks["spatial"] else "action" if key in marks["action"] else "all"
            items.append(Item(row.prompt, row.category, meta))
        return items

    def check(self) -> None:
        self._judge = self._judge or resolve_judge(self.config.judge, "t2icompbench", suffix="")
        if self._parser is None:
            kind, _, rest = self.config.parser.partition(":")
            self._parser = spacy_parser(rest) if kind == "spacy" else named_function(
                self.config.parser, "suite t2icompbench: parser")
        if self._clip is None:
            self._clip = build("reward", dict(self.config.clip))
            try:
                self._clip.check()
            except UserError as error:
                raise UserError(f"suite t2icompbench: clip: {error}") from None

    def headline(self) -> dict[str, Any]:
        # the source reports each category; flowrl's headline is their plain mean
        return {"figure": "mean", "of": "score", "by": "category", "scale": 1.0}

    def scorer_problems(self, scoring: dict[str, Any]) -> list[str]:
        problems = [SUBSTITUTION]
        judge = str(scoring.get("judge", self.config.judge))
        if BLIP not in served_model(judge):
            problems.append(f"judge {judge!r} is not the source's BLIP-VQA (served as openai:URL#{BLIP})")
        if plain(scoring.get("clip", CLIP)) != plain(CLIP):
            problems.append(f"clip {scoring['clip']!r} is not the source's CLIP ViT-B/32")
        if scoring.get("parser", "spacy:en_core_web_sm") != "spacy:en_core_web_sm":
            problems.append(f"parser {scoring['parser']!r} is not the source's spaCy en_core_web_sm")
        return problems

    def _clip_scores(self, images: Tensor, texts: list[str]) -> np.ndarray:
        from flowrl.rewards.frames import score_pictures

        scores = score_pictures(self._clip, images, texts)
        if not isinstance(scores, Tensor) or scores.shape != (len(texts),):
            raise UserError("suite t2icompbench: the clip scorer did not return one score per image")
        return scores.detach().double().cpu().numpy()

    def score(self, images: Tensor, items: Sequence[Item]) -> list[dict[str, float]]:
        self.check()
        assert self._judge is not None and self._parser is not None
        parsed = [self._parser(item.prompt) for item in items]
        clip = self._clip_scores(images, [p["without_adjectives"] if i.category == "complex" else i.prompt
                                          for p, i in zip(parsed, items, strict=True)])
        out = []
        for image, item, words, cosine in zip(images, items, parsed, clip, strict=True):
            if item.category in ATTRIBUTE:
                value = attribute_score(self._judge, image, words["noun_phrases"])
            elif item.category in DETECTED:
                value = yes_share(self._judge, image, f"{item.prompt}?")
            elif item.category == "non_spatial":
                value = float(cosine)
            else:
                attribute = attribute_score(self._judge, image, words["noun_phrases"])
                spatial = yes_share(self._judge, image, f"{item.prompt}?")
                value = complex_score(str(item.meta.get("parts", "all")), attribute, spatial, float(cosine))
            out.append({"score": float(value)})
        return out

    def aggregate(self, figures: Sequence[dict[str, float]], items: Sequence[Item]) -> dict[str, float]:
        """Each category's mean score over its prompts, and ``mean``: the plain mean of the categories present."""
        out = {}
        for name in CATEGORIES:
            chosen = [f["score"] for f, i in zip(figures, items, strict=True) if i.category == name]
            if chosen:
                out[name] = float(np.mean(chosen))
        return {"mean": float(np.mean(list(out.values()))) if out else math.nan, **out}
