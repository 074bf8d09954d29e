"""``edit_judge``: an instruction edit scored by a vision-language judge served behind an OpenAI-style
``/v1/chat/completions`` endpoint (vLLM, SGLang, a hosted API), with the VIEScore rubric that GEdit-Bench and
EditScore use (Ku et al., ACL 2024, arXiv 2312.14867; re-worded here, docs/rewards.md).

Two questions per result, as the rubric asks them:

- **semantic consistency** (the source image(s), then the result, and the instruction): *edit success*, 0 when the
  result does not do what the instruction asks, the top of the scale when it does it fully; *over-editing*, 0 when
  the result has become another picture, the top when only what was asked changed. ``SC = min(success,
  over-editing)``: an edit scores well only when it does the job *and* keeps the rest;
- **perceptual quality** (the result alone): *naturalness* (light, shadow, perspective, scale) and *artifacts*
  (distortion, smears, watermarks, broken bodies, objects that do not blend). ``PQ = min(naturalness,
  artifacts)``.

The overall score is ``O = sqrt(SC * PQ)``; the reward is ``O``, ``SC`` or ``PQ`` (``score``) divided by the top of
the scale, so it lies in [0, 1]. The judge answers with JSON, the scores first (``{"score": [a, b], ...}``). With
``logprobs = true`` each sub-score is the expected value over the scores the judge's top alternatives spell at that
place (:mod:`flowrl.rewards.judge_logprobs`), a smoother reward for a group of close results than the greedy
number; where the server gives none, or they cannot be placed, the number as written. The share of sub-scores read
from log-probabilities is the component ``expected``: 1 means all were.

The judge that scored is recorded: ``check()`` (and the first score without one) asks ``/v1/models`` and the
configured ``model`` must be served; each answer's own ``model`` field is kept, and :meth:`EditJudge.state_dict`
(saved in every checkpoint) holds the address, the model asked and every model that answered.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import attrs
import torch
from attrs.validators import ge, gt, le
from torch import Tensor

from flowrl.core.choices import one_of
from flowrl.core.conditions import conditions_of
from flowrl.core.interfaces import RewardModel
from flowrl.core.registry import register
from flowrl.rewards.base import RewardConfigError
from flowrl.rewards.http import Endpoint, RemoteRewardError, RewardServerUnavailable
from flowrl.rewards.judge_logprobs import expected_score
from flowrl.rewards.openai_judge import ask, chat_body, judge_health
from flowrl.rewards.remote import url_problem
from flowrl.rewards.wire import encode_condition, encode_image

Which = Literal["overall", "semantics", "quality"]
OnParseFailure = Literal["error", "zero"]

SEMANTICS = """You are judging an image edit made from an instruction. The first {sources} the original; the last \
image is the result of editing it. The result may look unchanged when the edit failed.

Instruction: {instruction}

Give two whole-number scores from 0 to {top}:
1. edit success: 0 if the result does not carry out the instruction at all, {top} if it carries it out fully and \
correctly;
2. over-editing: 0 if the result has become a different picture from the original, {top} if only what the \
instruction asks for has changed and everything else is kept.

Reply with JSON only, the scores first: {{"score": [edit_success, over_editing], "reasoning": "one short sentence"}}"""

QUALITY = """You are judging the visual quality of one generated image.

Give two whole-number scores from 0 to {top}:
1. naturalness: 0 if the scene looks wrong (impossible light, shadows, perspective or sizes), {top} if it looks \
natural;
2. artifacts: 0 if there is heavy distortion, smearing, a watermark, broken faces, hands or bodies, or objects that \
do not blend in, {top} if there are no visible artifacts.

Reply with JSON only, the scores first: {{"score": [naturalness, artifacts], "reasoning": "one short sentence"}}"""

SCORES = re.compile(r'"score"\s*:\s*\[\s*([0-9]+(?:\.[0-9]+)?)\s*,\s*([0-9]+(?:\.[0-9]+)?)\s*\]')
PARTS = ("success", "overedit", "naturalness", "artifacts")  # the sub-scores, in the order asked


def semantics_question(instruction: str, sources: int, top: int) -> str:
    """The semantic-consistency question (the rubric's first half) for ``sources`` original images."""
    lead = "image is" if sources == 1 else f"{sources} images are"
    return SEMANTICS.format(sources=lead, instruction=instruction, top=top)


def quality_question(top: int) -> str:
    """The perceptual-quality question (the result alone)."""
    return QUALITY.format(top=top)


def read_pair(answer: Any, text: str, top: int, logprobs: bool) -> tuple[list[float], int] | None:
    """The two sub-scores of a reply (the last ``"score": [a, b]`` in it), each the expected value from the
    log-probabilities where they place it, else as written, and how many came from log-probabilities; None when
    the reply has no such pair or a number is outside ``0..top``."""
    matches = list(SCORES.finditer(text))
    if not matches:
        return None
    match = matches[-1]
    values, expected = [], 0
    for group in (1, 2):
        written = float(match.group(group))
        if not 0 <= written <= top:
            return None
        value = expected_score(answer, text, match.span(group), 0, top) if logprobs else None
        expected += value is not None
        values.append(written if value is None else value)
    return values, expected


@register("reward", "edit_judge")
class EditJudge(RewardModel):
    """An edit scored by a served VLM judge against its source and instruction (VIEScore's SC/PQ rubric, 0-1)."""

    asks_a_server = True  # `flowrl validate` asks its server's health (flowrl.rewards.remote.server_problems)

    @attrs.frozen
    class Config:
        url: str = ""  # the judge server's root, e.g. http://127.0.0.1:8000 (it serves /v1/chat/completions)
        model: str = ""  # the served model's id ("" takes the first the server lists)
        score: Which = attrs.field(default="overall", validator=one_of(Which))  # O, SC or PQ
        top: int = attrs.field(default=10, validator=[ge(1), le(100)])  # the rubric's scale 0..top (VIEScore: 10)
        logprobs: bool = True  # expected value over the judge's top alternatives (the number as written without)
        top_logprobs: int = attrs.field(default=20, validator=[ge(1), le(20)])  # alternatives per token (API max 20)
        temperature: float = attrs.field(default=0.0, validator=ge(0))
        max_tokens: int = attrs.field(default=256, validator=gt(0))  # the scores come first; the rest is reasoning
        concurrency: int = attrs.field(default=8, validator=gt(0))  # requests in flight (two per image)
        timeout_s: float = attrs.field(default=120.0, validator=gt(0))  # per attempt
        retries: int = attrs.field(default=2, validator=ge(0))
        backoff_s: float = attrs.field(default=0.5, validator=ge(0))
        token_env: str = "OPENAI_API_KEY"  # environment variable holding the server's --api-key (unset: none)
        on_parse_failure: OnParseFailure = attrs.field(default="error", validator=one_of(OnParseFailure))

    @staticmethod
    def check_config(config: Any) -> Iterable[tuple[str, str]]:
        problem = url_problem(config.url)
        if problem:
            yield ("url", problem.replace("`flowrl serve`", "the judge's server (vllm serve MODEL)"))

    @classmethod
    def needs_conditions(cls, config: Config) -> bool:
        return True  # the source image(s): what the edit starts from

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        c = config
        self.endpoint = Endpoint(c.url, c.timeout_s, c.retries, c.backoff_s, os.environ.get(c.token_env, ""))
        self.model = ""  # the model asked (check() finds it)
        self.answered_by: set[str] = set()  # the ``model`` field of every answer
        self.components: dict[str, Tensor] = {}

    @property
    def label(self) -> str:
        return f"reward '{self.registered_name or 'edit_judge'}'"

    def check(self) -> None:
        """The server answers ``/v1/models`` and serves ``model``: else one line (exit status 2) naming it."""
        for key, problem in self.check_config(self.config):
            raise RewardConfigError(f"{self.label}: reward.{key} {problem}")
        try:
            self.model = judge_health(self.endpoint, self.config.model)["model"]
        except RewardServerUnavailable as error:
            raise RewardConfigError(f"{self.label}: {error}; start the judge's server or fix reward.url") from None
        except RemoteRewardError as error:
            raise RewardConfigError(f"{self.label}: {error}") from None

    # -- scoring ------------------------------------------------------------------------------------
    def _ask(self, images: list[str], question: str) -> tuple[list[float], int]:
        c = self.config
        body = chat_body(self.model, images, question, c.max_tokens, c.temperature, c.top_logprobs if c.logprobs else 0)
        text, answer = ask(self.endpoint, body)
        if isinstance(answer, dict) and isinstance(answer.get("model"), str):
            self.answered_by.add(answer["model"])
        found = read_pair(answer, text, c.top, c.logprobs)
        if found is None:
            if c.on_parse_failure != "zero":
                raise RemoteRewardError(
                    f"judge {self.endpoint.url}: reply {text[-160:]!r} has no \"score\": [a, b] with both in 0..{c.top}"
                    ' (set on_parse_failure = "zero" to score such replies 0)')
            return [0.0, 0.0], 0
        return found

    def _questions(self, images: Tensor, prompts: list[str]) -> list[tuple[list[str], str]]:
        top = self.config.top
        out: list[tuple[list[str], str]] = []
        for image, prompt in zip(images, prompts, strict=True):
            sources = conditions_of(prompt)
            if not sources:
                raise ValueError(f"edit_judge scores an edit against its source image; {str(prompt)[:40]!r} has none "
                                 "(use prompts with condition images: an edit task)")
            result = encode_image(image, "png")["data"]
            out.append(([encode_condition(s)["data"] for s in sources] + [result],
                        semantics_question(str(prompt), len(sources), top)))
            out.append(([result], quality_question(top)))
        return out

    def score(self, images: Tensor, prompts: list[str]) -> Tensor:
        if len(prompts) != images.shape[0]:
            raise ValueError(f"{images.shape[0]} images but {len(prompts)} prompts")
        if not self.model:
            self.check()
        questions = self._questions(images.detach().float().cpu(), prompts)
        if self.config.concurrency == 1 or len(questions) <= 1:
            found = [self._ask(*q) for q in questions]
        else:
            with ThreadPoolExecutor(max_workers=min(self.config.concurrency, len(questions))) as pool:
                found = list(pool.map(lambda q: self._ask(*q), questions))
        top = float(self.config.top)
        parts = torch.tensor([f[0][0:2] + g[0][0:2] for f, g in zip(found[::2], found[1::2], strict=True)],
                             dtype=torch.float64).reshape(-1, 4) / top
        semantics, quality = parts[:, :2].min(dim=1).values, parts[:, 2:].min(dim=1).values
        overall = (semantics * quality).sqrt()
        expected = torch.tensor([f[1] + g[1] for f, g in zip(found[::2], found[1::2], strict=True)],
                                dtype=torch.float64) / 4
        self.components = {name: parts[:, i].float() for i, name in enumerate(PARTS)}
        self.components.update(semantics=semantics.float(), quality=quality.float(), overall=overall.float(),
                               expected=expected.float())
        return self.components[self.config.score].clone()

    def eval_metrics(self, images: Tensor, prompts: list[str]) -> dict[str, float]:
        """``score`` (the configured one) and the means of ``overall``, ``semantics``, ``quality``, the four
        sub-scores and ``expected`` (the share read from log-probabilities), all in [0, 1]."""
        score = self.score(images, prompts)
        out = {"score": float(score.mean())}
        out.update({name: float(value.mean()) for name, value in self.components.items()})
        return {k: v for k, v in out.items() if math.isfinite(v)}

    def state_dict(self) -> dict[str, Any]:
        """The record of who judged: the address, the model asked and every model named by an answer."""
        return {"judge": {"url": self.endpoint.url, "model": self.model, "answered_by": sorted(self.answered_by)}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A resumed run keeps the models that answered before (a different judge now is added, not hidden)."""
        earlier = state.get("judge", {}).get("answered_by", [])
        self.answered_by.update(str(m) for m in earlier)
