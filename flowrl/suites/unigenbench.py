"""UniGenBench++ (CodeGoat24/UniGenBench, arXiv 2510.18701; its prompts CC BY 4.0, Tencent): 600 prompts in four
forms (``en``, ``en_long``, ``zh``, ``zh_long``), 4 images a prompt, each prompt with 1 to 10 testpoints (27
sub-dimensions in 10 primary dimensions: style, world knowledge, attribute, action, ...) and a description of
each testpoint in that prompt.

Scoring, re-derived from the source's ``eval/src/eval_common.py`` (its offline protocol): a multimodal judge gets
the image and an instruction made from the source's template (the prompt, its testpoints, their definitions and
descriptions) and answers with a ``<score>[0, 1, ...]</score>`` list, one 0 or 1 per testpoint; an answer that
cannot be read is asked again, up to 10 more times. The figures: each primary dimension's and sub-dimension's
accuracy (testpoints met over testpoints asked, pooled over images) x 100, and ``overall`` the plain mean of the
primary dimensions' (the leaderboard's). The per-image figure ``score`` (the share of its testpoints met) is what
the comparison pairs.

The judge is served: ``judge = "URL#MODEL"``, an OpenAI-style chat endpoint (the source's offline judge is
UniGenBench-EvalModel-qwen3vl-32b-v1 served by vLLM as ``QwenVL``; greedy, at most 4096 tokens), or
``"module:function"`` (``function(image, instruction) -> answer text``). The instruction templates are read from
the source's pinned file (``flowrl data fetch unigenbench-judge``), never shipped with flowrl.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np
from attrs.validators import in_
from torch import Tensor

from flowrl.core.errors import UserError
from flowrl.core.registry import register
from flowrl.suites.interface import Item, Suite, named_function
from flowrl.suites.prompt_sets import suite_items
from flowrl.suites.protocol import Protocol

FORMS = ("en", "en_long", "zh", "zh_long")
RETRIES = 10  # the source's max_retries: 11 tries in all
OWN_JUDGES = ("unigenbench-evalmodel", "qwenvl")  # the source's offline judge, by its hub or its served name
Answerer = Callable[[Tensor, str], str]


def dimension(testpoint: str) -> str:
    """A testpoint's primary dimension: its name before the first "-" (``"Attribute - Color"``: Attribute)."""
    return testpoint.split("-", 1)[0].strip()


def instruction(template: dict[str, Any], prompt: str, points: Sequence[str], notes: Sequence[str]) -> str:
    """The judge's instruction for one prompt, built as the source builds it from its template record."""
    explained = template["explanations"]
    unknown = [p for p in points if p not in explained]
    if unknown:
        raise UserError(f"UniGenBench prompt {prompt[:60]!r}: testpoint {unknown[0]!r} has no definition")
    definitions = f"{template['checkpoint_header']}:\u300c" + "".join(f"\n{p}: {explained[p]}" for p in points)
    described = f"{template['checkpoint_desc_header']}:\u300c" + "".join(
        f"\n{p}: {d}" for p, d in zip(points, notes, strict=True))
    return str(template["prompt"]).format(prompt=prompt, testpoint=str(list(points)),
                                          explanation=definitions + "\n\u300d",
                                          test_explanation=described + "\n\u300d")


def read_scores(text: str, count: int) -> list[int] | None:
    """The ``<score>`` list of an answer when it holds ``count`` scores of 0 or 1 (None otherwise)."""
    found = re.search(r"<score>(.*?)</score>", text or "", re.DOTALL)
    try:
        scores = ast.literal_eval(found.group(1).strip()) if found else None
    except (ValueError, SyntaxError):
        return None
    if not isinstance(scores, list) or len(scores) != count or any(s not in (0, 1) for s in scores):
        return None
    return [int(s) for s in scores]


def served_answerer(address: str) -> Answerer:
    """A served judge: the image, then the instruction, in one user message; greedy, at most 4096 tokens."""
    from flowrl.rewards.http import Endpoint
    from flowrl.rewards.wire import encode_image

    url, _, model = address.partition("#")
    endpoint = Endpoint(url, 600.0, retries=2, backoff_s=2.0)

    def answer(image: Tensor, text: str) -> str:
        data = encode_image(image, "png")["data"]
        content = [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}},
                   {"type": "text", "text": text}]
        body = {"model": model or "QwenVL", "messages": [{"role": "user", "content": content}],
                "do_sample": False, "temperature": 0, "max_tokens": 4096}
        reply = endpoint.post("/v1/chat/completions", body)
        try:
            return str(reply["choices"][0]["message"]["content"])
        except (KeyError, IndexError, TypeError):
            raise UserError(f"judge {url}: the answer has no choices[0].message.content") from None

    return answer


@register("suite", "unigenbench")
class UniGenBenchSuite(Suite):
    """UniGenBench++: 600 prompts (en, en_long, zh, zh_long) x 4 images, a served judge per testpoint (x 100)."""

    primary = "score"
    fractions = ("score",)
    source = "CodeGoat24/UniGenBench data/test_prompts_*.csv (CC BY 4.0) and eval/src/eval_common.py (re-derived)"
    scoring = ("judge",)

    @attrs.frozen
    class Config:
        form: str = attrs.field(default="en", validator=in_(FORMS))  # which prompts: en, en_long, zh, zh_long
        prompts: str = ""  # a file of your own (.jsonl: prompt, lang, testpoints, descriptions)
        judge: str = ""  # "http://HOST:PORT#MODEL" (served, OpenAI chat) or "module:function"
        templates: str = ""  # the judge's template file of your own (.jsonl); default: fetched unigenbench-judge

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self._answer: Answerer | None = None
        self._templates: dict[str, dict[str, Any]] | None = None

    def protocol(self) -> Protocol:
        # the source's README: 4 images a prompt; steps, resolution and guidance are the base's own (flowrl's
        # choice of 28 steps, as for the preference suites)
        return Protocol(steps=28, images=4, seed=0)

    def items(self) -> list[Item]:
        rows = suite_items(self.config.prompts, "unigenbench")
        items = [r for r in rows if (self.config.prompts or r.category == self.config.form)
                 and "unreadable" not in r.meta]  # en_long's prompt 509 at the pinned commit (docs/evaluation.md)
        for item in items:
            points, notes = item.meta.get("testpoints"), item.meta.get("descriptions")
            if not isinstance(points, list) or not isinstance(notes, list) or len(points) != len(notes) or not points:
                raise UserError(f"UniGenBench prompt {item.prompt[:60]!r}: testpoints and descriptions must be "
                                "non-empty lists of one length")
        return items

    def published_items(self) -> list[Item] | None:
        from flowrl.suites.data import PromptSetError

        try:
            return type(self)(type(self).Config(form=self.config.form)).items()
        except PromptSetError:
            return None

    def check(self) -> None:
        if self._templates is None:
            rows = suite_items(self.config.templates, "unigenbench-judge")
            self._templates = {r.category: {"prompt": r.prompt, **r.meta} for r in rows}
        if self._answer is None:
            judge = self.config.judge
            if judge.startswith(("http://", "https://")):
                self._answer = served_answerer(judge)
            elif ":" in judge:
                self._answer = named_function(judge, "suite unigenbench: judge")
            else:
                raise UserError("suite unigenbench needs a judge: judge = \"http://HOST:PORT#MODEL\" (the served "
                                "UniGenBench-EvalModel, docs/evaluation.md) or \"module:function\"")

    def headline(self) -> dict[str, Any]:
        return {"figure": "score", "of": "score", "by": "", "scale": 100.0}  # the mean share of testpoints met

    def scorer_problems(self, scoring: dict[str, Any]) -> list[str]:
        judge = str(scoring.get("judge", self.config.judge))
        served = judge.startswith(("http://", "https://"))
        if served and any(name in judge.partition("#")[2].lower() for name in OWN_JUDGES):
            return []  # the source's offline judge behind a served endpoint: flowrl cannot see behind the URL
        return [f"judge {judge!r} is not the source's offline judge (UniGenBench-EvalModel served as URL#QwenVL)"]

    def judged(self, image: Tensor, item: Item) -> list[int]:
        assert self._answer is not None and self._templates is not None
        lang = str(item.meta.get("lang", item.category[:2]))
        if lang not in self._templates:
            raise UserError(f"UniGenBench prompt {item.prompt[:60]!r}: no judge template for language {lang!r}")
        points = item.meta["testpoints"]
        text = instruction(self._templates[lang], item.prompt, points, item.meta["descriptions"])
        for _ in range(RETRIES + 1):
            scores = read_scores(self._answer(image, text), len(points))
            if scores is not None:
                return scores
        raise UserError(f"suite unigenbench: the judge gave no readable <score> list of {len(points)} for prompt "
                        f"{item.prompt[:60]!r} in {RETRIES + 1} tries")

    def score(self, images: Tensor, items: Sequence[Item]) -> list[dict[str, float]]:
        self.check()
        out = []
        for image, item in zip(images, items, strict=True):
            scores = self.judged(image, item)
            row = {"score": float(np.mean(scores))}
            assert self._templates is not None
            known = self._templates[str(item.meta.get("lang", item.category[:2]))]["explanations"]
            for point in known:  # every testpoint of the language, so that every image has the same keys
                for key in (f"dim/{dimension(point)}", f"sub/{point}"):
                    row[f"_met/{key}"], row[f"_n/{key}"] = 0.0, 0.0
            for point, value in zip(item.meta["testpoints"], scores, strict=True):
                for key in {f"dim/{dimension(point)}", f"sub/{point}"}:
                    row[f"_met/{key}"] = row.get(f"_met/{key}", 0.0) + value
                    row[f"_n/{key}"] = row.get(f"_n/{key}", 0.0) + 1
            out.append(row)
        return out

    def aggregate(self, figures: Sequence[dict[str, float]], items: Sequence[Item]) -> dict[str, float]:
        """``score`` (100 x the mean over prompts), each dimension's and sub-dimension's pooled accuracy x 100, and
        ``overall``: the plain mean of the primary dimensions'."""
        met: dict[str, float] = {}
        asked: dict[str, float] = {}
        for f in figures:
            for key, value in f.items():
                if key.startswith("_met/"):
                    met[key[5:]] = met.get(key[5:], 0.0) + value
                elif key.startswith("_n/"):
                    asked[key[3:]] = asked.get(key[3:], 0.0) + value
        out = {"score": 100 * float(np.mean([f["score"] for f in figures]))} if figures else {}
        accuracy = {key: 100 * met[key] / asked[key] for key in sorted(asked) if asked[key]}
        dims = [v for k, v in accuracy.items() if k.startswith("dim/")]
        if dims:
            out["overall"] = float(np.mean(dims))
        return {**out, **accuracy}
