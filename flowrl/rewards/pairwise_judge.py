"""``[reward.judge] type = "openai"``: a vision-language model behind an OpenAI-style ``/v1/chat/completions`` server
(vLLM's or SGLang's, as the Pref-GRPO release serves UnifiedReward-Think) as a pairwise judge.

The client is the pointwise judge's (:mod:`flowrl.rewards.openai_judge`, ``[[reward]] type = "remote"`` with
``protocol = "openai"``): the same health check (``GET /v1/models``), retries and timeouts
(:mod:`flowrl.rewards.http`) and PNG data URLs. One request per pair: a user message with the two images, first
then second (after the prompt's condition images with ``conditions = true``), and ``prompt_template`` with the
prompt in it. The verdict is the last match of ``verdict_regex`` in the reply: its group 1 equal to
``first_label`` is a win for the first image, to ``second_label`` a win for the second, to ``tie_label`` (when set)
a tie. A reply without a verdict is a tie (the release's rule) unless ``on_parse_failure = "error"``;
:attr:`OpenAIPairJudge.unreadable` counts them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import attrs
import torch
from attrs.validators import ge, gt
from torch import Tensor

from flowrl.core.choices import one_of
from flowrl.core.conditions import conditions_of
from flowrl.core.judges import PairwiseJudge
from flowrl.core.registry import register
from flowrl.rewards.base import RewardConfigError
from flowrl.rewards.http import Endpoint, RemoteRewardError, RewardServerUnavailable
from flowrl.rewards.openai_judge import chat_body, judge_health, reply_text
from flowrl.rewards.remote import url_problem
from flowrl.rewards.wire import encode_image

DEFAULT_PAIR_TEMPLATE = (
    "Both images were generated from the text prompt: \"{prompt}\". Image 1 is the first image, Image 2 the "
    "second. Compare how well each matches the prompt and how good it looks. End your answer with "
    "'Better: Image 1' or 'Better: Image 2'."
)
OnUnreadable = Literal["tie", "error"]


def rgb(condition: Any) -> Tensor:
    """A condition image as ``(3, H, W)`` in [0, 1] (a grey image repeated, an alpha channel dropped)."""
    image = condition.tensor()
    return image.repeat(3, 1, 1) if image.shape[0] == 1 else image[:3]


@register("judge", "openai")
class OpenAIPairJudge(PairwiseJudge):
    """A vision-language judge served behind an OpenAI-style chat API: both images in one request, its verdict read
    from the reply with ``verdict_regex`` (docs/rewards.md, "Judges")."""

    @attrs.frozen
    class Config:
        url: str = ""  # the server's base address, e.g. http://127.0.0.1:8000 (vLLM's `serve`)
        model: str = ""  # the served model's id ("" takes the first the server lists)
        prompt_template: str = DEFAULT_PAIR_TEMPLATE  # the question; {prompt} is the pair's prompt
        verdict_regex: str = r"Better:\s*Image\s*([12])"  # group 1 of its last match names the better image
        first_label: str = "1"  # group 1 equal to this: the first image wins
        second_label: str = "2"  # ... the second image wins
        tie_label: str = ""  # ... a tie ("": the template allows no tie)
        on_parse_failure: OnUnreadable = attrs.field(default="tie", validator=one_of(OnUnreadable))
        conditions: bool = False  # send the prompt's condition images (an edit's source) before the two images
        max_tokens: int = attrs.field(default=1024, validator=gt(0))  # a thinking judge writes before its verdict
        concurrency: int = attrs.field(default=8, validator=gt(0))  # requests in flight at once
        timeout_s: float = attrs.field(default=120.0, validator=gt(0))  # per attempt
        retries: int = attrs.field(default=2, validator=ge(0))  # after the first attempt
        backoff_s: float = attrs.field(default=0.5, validator=ge(0))  # wait before retry k: backoff_s * 2^(k-1)
        token_env: str = "FLOWRL_SERVE_TOKEN"  # environment variable holding the bearer token (unset: none)

    @staticmethod
    def check_config(config: Config) -> Iterable[tuple[str, str]]:
        problem = url_problem(config.url)
        if problem:
            yield ("url", problem)
        try:
            pattern = re.compile(config.verdict_regex)
        except re.error as error:
            yield ("verdict_regex", f"is not a regular expression: {error}")
        else:
            if pattern.groups < 1:
                yield ("verdict_regex", "needs a group, e.g. ([12]), around the better image's label")
        if "{prompt}" not in config.prompt_template:
            yield ("prompt_template", "must contain {prompt} (where the pair's prompt goes)")
        labels = [config.first_label, config.second_label] + ([config.tie_label] if config.tie_label else [])
        if not config.first_label or not config.second_label or len(set(labels)) < len(labels):
            yield ("second_label", f"first_label, second_label (and tie_label) must be distinct and not empty, "
                                   f"got {labels}")

    @classmethod
    def needs_conditions(cls, config: Config) -> bool:
        return bool(config.conditions)

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        c = config
        self.endpoint = Endpoint(c.url, c.timeout_s, c.retries, c.backoff_s, os.environ.get(c.token_env, ""))
        self.model = ""  # the model the server answered with (check(), or the first compare())
        self.unreadable = 0  # replies without a verdict so far

    @property
    def label(self) -> str:
        return f"judge '{self.registered_name or 'openai'}'"

    def check(self) -> None:
        """Ask the server which models it serves; a :class:`RewardConfigError` (exit status 2) naming the address
        when it does not answer, or does not serve ``model``."""
        for key, message in self.check_config(self.config):
            raise RewardConfigError(f"{self.label}: reward.judge.{key} {message}")
        try:
            self.model = judge_health(self.endpoint, self.config.model, "reward.judge.model")["model"]
        except RewardServerUnavailable as error:
            raise RewardConfigError(f"{self.label}: {error}; start it or fix reward.judge.url") from None
        except RemoteRewardError as error:
            raise RewardConfigError(f"{self.label}: {error}") from None

    def verdict(self, text: str) -> float | None:
        """1, 0 or 0.5 from the last match of ``verdict_regex`` in ``text``; None without a verdict."""
        c = self.config
        matches = list(re.finditer(c.verdict_regex, text))
        found = matches[-1].group(1) if matches else None
        if found is None:
            return None
        found = found.strip()
        return {c.first_label: 1.0, c.second_label: 0.0, **({c.tie_label: 0.5} if c.tie_label else {})}.get(found)

    def _ask(self, first: Tensor, second: Tensor, prompt: str) -> float | None:
        images = [rgb(c) for c in conditions_of(prompt)] if self.config.conditions else []
        text = self.config.prompt_template.replace("{prompt}", str(prompt))
        pngs = [encode_image(image, "png")["data"] for image in (*images, first, second)]
        body = chat_body(self.model, pngs, text, self.config.max_tokens)
        answer = self.endpoint.post("/v1/chat/completions", body)
        try:
            reply = reply_text(answer)
        except ValueError as error:
            raise RemoteRewardError(f"judge {self.endpoint.url}/v1/chat/completions sent a malformed answer: "
                                    f"{error}") from None
        value = self.verdict(reply)
        if value is None and self.config.on_parse_failure == "error":
            raise RemoteRewardError(f"judge {self.endpoint.url}: reply {reply[-160:]!r} has no verdict matching "
                                    f"verdict_regex {self.config.verdict_regex!r} (on_parse_failure = \"tie\" "
                                    "counts such replies as ties)")
        return value

    def compare(self, first: Tensor, second: Tensor, prompts: list[str]) -> Tensor:
        if not self.model:  # a judge built without check() asks now
            self.model = judge_health(self.endpoint, self.config.model, "reward.judge.model")["model"]
        jobs = range(len(prompts))
        if self.config.concurrency == 1 or len(prompts) <= 1:
            found = [self._ask(first[k], second[k], prompts[k]) for k in jobs]
        else:
            with ThreadPoolExecutor(max_workers=min(self.config.concurrency, len(prompts))) as pool:
                found = list(pool.map(lambda k: self._ask(first[k], second[k], prompts[k]), jobs))
        self.unreadable += sum(value is None for value in found)
        return torch.tensor([0.5 if value is None else value for value in found], dtype=torch.float32)
