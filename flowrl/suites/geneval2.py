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

import math
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np
from torch import Tensor

from flowrl.errors import UserError
from flowrl.registry import register
from flowrl.suites.interface import Item, Suite, named_function
from flowrl.suites.prompt_sets import suite_items
from flowrl.suites.protocol import Protocol

SKILLS = ("object", "attribute", "count", "position", "verb")
NUMBERS = ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
SUFFIX = " Answer in one word."
Judge = Callable[[Tensor, str, list[str]], float]


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


def transformers_judge(path: str) -> Judge:
    """A local transformers vision-language model: the probabilities of its first answer token."""
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    try:
        processor = AutoProcessor.from_pretrained(path, local_files_only=True)
        model = AutoModelForImageTextToText.from_pretrained(path, local_files_only=True).eval()
    except (OSError, ImportError, ValueError) as error:  # no such folder; a processor needing a missing extra
        raise UserError(f"judge transformers:{path}: cannot load a vision-language model there ({error})") from None
    tokenizer = processor.tokenizer

    @torch.no_grad()
    def probability(image: Tensor, question: str, forms: list[str]) -> float:
        pixels = (image.float().clamp(0, 1) * 255).round().byte().permute(1, 2, 0).cpu().numpy()
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question + SUFFIX}]}]
        chat = processor.apply_chat_template(messages, add_generation_prompt=True)
        inputs = processor(text=[chat], images=[Image.fromarray(pixels)], return_tensors="pt").to(model.device)
        # one greedy token through generate(), as the source does: its first-step scores include the model's
        # logits processors (a repetition penalty of its generation config, say)
        out = model.generate(**inputs, max_new_tokens=1, do_sample=False, output_scores=True,
                             return_dict_in_generate=True)
        probs = out.scores[0][0].float().softmax(-1)
        ids = [tokenizer.encode(form, add_special_tokens=False)[0] for form in forms]
        return float(sum(probs[i] for i in ids))

    return probability


def openai_judge(address: str) -> Judge:
    """A served judge: one chat request per question, ``max_tokens = 1`` with the top 20 log-probabilities."""
    from flowrl.rewards.http import Endpoint
    from flowrl.rewards.wire import encode_image

    url, _, model = address.partition("#")
    endpoint = Endpoint(url, 300.0, retries=2, backoff_s=2.0)

    def probability(image: Tensor, question: str, forms: list[str]) -> float:
        data = encode_image(image, "png")["data"]
        content = [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}},
                   {"type": "text", "text": question + SUFFIX}]
        body = {"model": model, "messages": [{"role": "user", "content": content}], "temperature": 0,
                "max_tokens": 1, "logprobs": True, "top_logprobs": 20}
        answer = endpoint.post("/v1/chat/completions", body)
        try:
            top = answer["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
            found = {str(t["token"]): math.exp(float(t["logprob"])) for t in top}
        except (KeyError, IndexError, TypeError, ValueError):
            raise UserError(f"judge {url}: the answer has no choices[0].logprobs.content[0].top_logprobs") from None
        return sum(found.get(form, 0.0) for form in forms)

    return probability


def resolve_judge(name: str) -> Judge:
    kind, _, rest = name.partition(":")
    if kind == "transformers" and rest:
        return transformers_judge(rest)
    if kind == "openai" and rest:
        return openai_judge(rest)
    if rest and kind:
        return named_function(name, "suite geneval2: judge")  # type: ignore[no-any-return]
    raise UserError("suite geneval2 needs a judge: judge = \"transformers:PATH\", \"openai:URL#MODEL\" or "
                    "\"module:function\" (docs/evaluation.md)")


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
