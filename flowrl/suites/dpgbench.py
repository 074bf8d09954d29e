"""DPG-Bench (ELLA, arXiv 2403.05135): 1,065 dense prompts, each with a graph of yes/no questions (DSG-style):
a question's parents are the questions it presupposes ("is the cat black?" after "is there a cat?").

Scoring, re-derived from the source's ``dpg_bench/compute_dpg_bench.py``: a VQA model answers every question of
an image; a question scores 1 when answered yes, and a question whose parent scored 0 scores 0 whatever its own
answer. An image's score is the mean over its prompt's questions; the DPG-Bench score is 100 x the mean over
images. Category figures (``entity``, ``attribute``, ``relation``, ``global``, ``other``: the first part of each
question's tuple) pool the questions' own answers, before the parent rule, over all images, x 100.

Where flowrl differs from the source's script: every image of a prompt counts in the category figures (the
script keeps only the last image of each 2x2 grid for them), and the file's first question is kept (the script
skips the first row of the file). The source's VQA model is mPLUG-large (ModelScope's
``damo/mplug_visual-question-answering_coco_large_en``), which answers in words; flowrl asks a judge (the VQA
judges of :mod:`flowrl.suites.judge`) and reads its first answer token: the question is answered yes when the
judge's probability of "yes" (four spellings) exceeds that of "no". The suite's own judge is mPLUG-large served
(``judge = "openai:URL#mplug_visual-question-answering_coco_large_en"``, docs/evaluation.md); any other judge is
marked not comparable.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np
from torch import Tensor

from flowrl.core.errors import UserError
from flowrl.core.registry import register
from flowrl.suites.interface import Item, Suite
from flowrl.suites.judge import NO, YES, Judge, resolve_judge, served_model
from flowrl.suites.prompt_sets import suite_items
from flowrl.suites.protocol import Protocol

CATEGORIES = ("entity", "attribute", "relation", "global", "other")
MPLUG = "mplug_visual-question-answering_coco_large_en"


def category(question: dict[str, Any]) -> str:
    """The broad category of a question: its tuple's text before the first "-" (``"entity - whole (cat)"``)."""
    return str(question["tuple"]).split("(")[0].split("-")[0].strip()


def graph_scores(answers: dict[int, bool], parents: dict[int, list[int]]) -> dict[int, float]:
    """Each question's score: 1 when answered yes, set to 0 when a parent's score is 0. Questions are visited in
    their order, as the source does, so a parent already set to 0 by its own parent sets its children to 0 too;
    parents outside the graph are not questions and do not count."""
    scores = {q: float(yes) for q, yes in answers.items()}
    for q in scores:
        if any(scores.get(p, 1.0) == 0 for p in parents[q]):
            scores[q] = 0.0
    return scores


@register("suite", "dpgbench")
class DPGBenchSuite(Suite):
    """DPG-Bench: 1,065 dense prompts x 4 images, a VQA judge over each prompt's question graph (x 100)."""

    primary = "dpg"
    fractions = ("dpg",)
    source = "TencentQQGYLab/ELLA dpg_bench/dpg_bench.csv (Apache-2.0) and its compute_dpg_bench.py (re-derived)"
    scoring = ("judge",)

    @attrs.frozen
    class Config:
        prompts: str = ""  # a file of your own (.jsonl: prompt, questions [{id, parents, tuple, question}])
        judge: str = ""  # "openai:URL#MODEL" (the source's mPLUG served), "transformers:PATH" or "module:function"

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self._judge: Judge | None = None

    def protocol(self) -> Protocol:
        # ELLA's README: 4 images a prompt (scored as a 2x2 grid there, one by one here); steps, resolution and
        # guidance are the base's own (flowrl's choice of 28 steps, as for the preference suites)
        return Protocol(steps=28, images=4, seed=0)

    def items(self) -> list[Item]:
        items = suite_items(self.config.prompts, "dpgbench")
        for item in items:
            questions = item.meta.get("questions")
            if not isinstance(questions, list) or not questions or not all(
                    isinstance(q, dict) and {"id", "parents", "tuple", "question"} <= set(q) for q in questions):
                raise UserError(f"DPG-Bench prompt {item.prompt[:60]!r}: questions must be a non-empty list of "
                                "{id, parents, tuple, question}")
        return items

    def check(self) -> None:
        self._judge = self._judge or resolve_judge(self.config.judge, "dpgbench", suffix="")

    def headline(self) -> dict[str, Any]:
        return {"figure": "dpg_score", "of": "dpg", "by": "", "scale": 100.0}  # 100 x the mean over images

    def scorer_problems(self, scoring: dict[str, Any]) -> list[str]:
        judge = str(scoring.get("judge", self.config.judge))
        if MPLUG in served_model(judge):
            return []  # the source's mPLUG-large behind a served endpoint: flowrl cannot see behind the URL
        return [f"judge {judge!r} is not the source's VQA model (mPLUG-large, served as openai:URL#{MPLUG})"]

    def answered_yes(self, image: Tensor, question: str) -> bool:
        assert self._judge is not None
        return self._judge(image, question, YES) > self._judge(image, question, NO)

    def score(self, images: Tensor, items: Sequence[Item]) -> list[dict[str, float]]:
        self.check()
        out = []
        for image, item in zip(images, items, strict=True):
            questions = item.meta["questions"]
            answers = {int(q["id"]): self.answered_yes(image, str(q["question"])) for q in questions}
            scores = graph_scores(answers, {int(q["id"]): [int(p) for p in q["parents"]] for q in questions})
            row = {"dpg": float(np.mean(list(scores.values())))}
            for name in CATEGORIES:  # the questions' own answers, pooled over images by aggregate
                own = [answers[int(q["id"])] for q in questions if category(q) == name]
                row[f"_yes/{name}"], row[f"_n/{name}"] = float(sum(own)), float(len(own))
            out.append(row)
        return out

    def aggregate(self, figures: Sequence[dict[str, float]], items: Sequence[Item]) -> dict[str, float]:
        """100 x the mean score over prompts (each the mean over its images), per category 100 x the share of
        its questions answered yes, pooled over every image."""
        out = {"dpg": 100 * float(np.mean([f["dpg"] for f in figures]))} if figures else {}
        for name in CATEGORIES:
            n = sum(f.get(f"_n/{name}", 0.0) for f in figures)
            if n:
                out[f"category/{name}"] = 100 * sum(f[f"_yes/{name}"] for f in figures) / n
        return out
