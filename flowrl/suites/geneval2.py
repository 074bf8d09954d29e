"""The GenEval 2 suite: 800 prompts of 3 to 10 atoms, one image each, scored by Soft-TIFA: a vision-language
model answers each of a prompt's atom questions, and a question's score is the probability the model gives the
expected answer in its first token (summed over the answer's spellings). Per prompt the arithmetic (AM) and
geometric (GM) means of its questions' scores; the suite's figures are 100 x their means over prompts, per skill
100 x the mean over all questions of that skill (pooled across prompts, AM), and per atom count 100 x the mean GM.

The judge (``judge``): ``"transformers:PATH"`` a local transformers vision-language model in process (the
source's is Qwen3-VL-8B-Instruct), ``"openai:URL"`` (or ``"openai:URL#MODEL"``) a served one over the OpenAI
chat protocol with first-token log-probabilities (an answer's spelling counts when the served top list holds it
verbatim), or ``"module:function"`` (``function(image, question, spellings) -> probability``).
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
from flowrl.suites.judge import SUFFIX, Judge, openai_judge, transformers_judge  # noqa: F401 (geneval2's names)
from flowrl.suites.judge import resolve_judge as shared_resolve
from flowrl.suites.prompt_sets import suite_items
from flowrl.suites.protocol import Protocol

SKILLS = ("object", "attribute", "count", "position", "verb")
NUMBERS = ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


def spellings(question: str, answer: str) -> list[str]:
    """The spellings whose first-token probabilities are summed, as the source sums them: for a "How many"
    question the answer word as given, capitalised, each with a leading space, and its digits with and without a
    space ("other" for a word that is not one to ten); for any other question "Yes" in four forms (every other
    question of GenEval 2 expects yes). Only each spelling's first token is read: with a tokenizer that splits
    digits, "10" counts the probability of "1"."""
    if question.startswith("How many"):
        digits = str(NUMBERS.index(answer) + 1) if answer in NUMBERS else "other"
        return [answer, answer.capitalize(), " " + answer, " " + answer.capitalize(), digits, " " + digits]
    return ["Yes", "yes", " yes", " Yes"]


def resolve_judge(name: str) -> Judge:
    return shared_resolve(name, "geneval2")


@register("suite", "geneval2")
class GenEval2Suite(Suite):
    """GenEval 2: 800 prompts, one image each, Soft-TIFA (AM and GM, per skill and per atom count) by a VQA judge."""

    primary = "soft_tifa_gm"
    source = "facebookresearch/GenEval2 geneval2_data.jsonl (CC BY-NC 4.0) and its Soft-TIFA (re-derived)"

    scoring = ("judge",)

    @attrs.frozen
    class Config:
        prompts: str = ""  # a file of your own (.jsonl: prompt, atom_count, vqa_list, skills); default: fetched
        judge: str = ""  # "transformers:PATH", "openai:URL#MODEL" or "module:function"

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self._judge: Judge | None = None

    def protocol(self) -> Protocol:
        # the peers' pinned GenEval 2 protocol (one image a prompt at 512 px, 40 steps, guidance 1.0)
        return Protocol(steps=40, images=1, seed=0, guidance=1.0, resolution=512)

    def items(self) -> list[Item]:
        items = suite_items(self.config.prompts, "geneval2")
        for item in items:
            questions, skills = item.meta.get("vqa_list"), item.meta.get("skills")
            if not isinstance(questions, list) or not isinstance(skills, list) or len(questions) != len(skills):
                raise UserError(f"GenEval 2 prompt {item.prompt!r}: vqa_list and skills must be lists of one length")
        return [Item(i.prompt, f"atoms_{i.meta.get('atom_count', len(i.meta['vqa_list']))}", i.meta) for i in items]

    def check(self) -> None:
        self._judge = self._judge or resolve_judge(self.config.judge)

    def headline(self) -> dict[str, Any]:
        return {"figure": "soft_tifa_gm", "of": "soft_tifa_gm", "by": "", "scale": 100.0}

    def scorer_problems(self, scoring: dict[str, Any]) -> list[str]:
        judge = str(scoring.get("judge", self.config.judge))
        if judge.startswith(("transformers:", "openai:")):
            return []  # a vision-language judge: the source's model is the user's to load (docs/evaluation.md)
        return [f"judge {judge!r} is not a vision-language model's (the source's is Qwen3-VL-8B-Instruct)"]

    def score(self, images: Tensor, items: Sequence[Item]) -> list[dict[str, float]]:
        self.check()
        assert self._judge is not None
        out = []
        for image, item in zip(images, items, strict=True):
            scores = [self._judge(image, q, spellings(q, a)) for q, a in item.meta["vqa_list"]]
            values = np.asarray(scores, dtype=np.float64)
            row = {"soft_tifa_am": float(values.mean()), "soft_tifa_gm": float(np.exp(np.log(values).mean()))
                   if (values > 0).all() else 0.0}
            for skill in SKILLS:  # pooled over prompts by aggregate: each prompt's sum and count per skill
                chosen = [s for s, k in zip(scores, item.meta["skills"], strict=True) if k == skill]
                row[f"_sum/{skill}"], row[f"_n/{skill}"] = float(sum(chosen)), float(len(chosen))
            out.append(row)
        return out

    def aggregate(self, figures: Sequence[dict[str, float]], items: Sequence[Item]) -> dict[str, float]:
        """100 x the mean AM and GM over prompts, per skill 100 x the pooled question mean, per atom count
        100 x the mean GM."""
        out = {key: 100 * float(np.mean([f[key] for f in figures])) for key in ("soft_tifa_am", "soft_tifa_gm")}
        for skill in SKILLS:
            n = sum(f[f"_n/{skill}"] for f in figures)
            if n:
                out[f"skill/{skill}"] = 100 * sum(f[f"_sum/{skill}"] for f in figures) / n
        for category in sorted({i.category for i in items}, key=lambda c: int(c.split("_")[1])):
            chosen = [f["soft_tifa_gm"] for f, i in zip(figures, items, strict=True) if i.category == category]
            out[f"soft_tifa_gm/{category}"] = 100 * float(np.mean(chosen))
        return out
