"""``[[reward]] type = "remote"``: a reward scored by another process, venv or machine over HTTP.

Two protocols: ``flowrl`` (``flowrl serve``'s, :mod:`flowrl.rewards.wire`) and ``openai`` (a vision-language
judge behind an OpenAI-style chat-completions server such as vLLM or SGLang, :mod:`flowrl.rewards.openai_judge`).
The batch goes in chunks of ``batch_size`` images (``concurrency`` of them in flight); each request has a
timeout and bounded retries (:mod:`flowrl.rewards.http`). ``check()``, run before any model loads, asks the
server's health, so a server that is down stops the run (or ``flowrl validate``) with exit status 2 naming the
address. A server that stops answering mid-run raises :class:`RewardServerUnavailable`, on which the trainer
writes a checkpoint of the iteration's start before it stops.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import attrs
import torch
from attrs.validators import ge, gt
from torch import Tensor

from flowrl.core.choices import one_of
from flowrl.core.interfaces import RewardModel
from flowrl.core.registry import register
from flowrl.rewards.base import RewardConfigError
from flowrl.rewards.http import Endpoint, RemoteRewardError, RewardServerUnavailable
from flowrl.rewards.openai_judge import DEFAULT_TEMPLATE, JudgeSettings, judge_health, judge_score
from flowrl.rewards.wire import (
    ENCODINGS,
    PROTOCOL,
    PROTOCOL_CONDITIONS,
    PROTOCOLS,
    Encoding,
    WireError,
    parse_metrics_answer,
    parse_score_answer,
    score_request,
)

__all__ = ["RemoteReward", "RemoteRewardError", "RewardServerUnavailable", "url_problem"]

Service = Literal["flowrl", "openai"]  # what the server speaks: flowrl's wire protocol or an OpenAI chat API
OnParseFailure = Literal["error", "zero"]


def url_problem(url: str) -> str:
    """Why ``url`` cannot be a reward server's base address ("" when it can)."""
    if not url:
        return "no server address: set url (e.g. \"http://127.0.0.1:8700\", what `flowrl serve` listens on)"
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{url!r} is not an http:// or https:// address with a host"
    if parts.query or parts.fragment:
        return f"{url!r}: a base address takes no ?query or #fragment"
    try:
        parts.port  # noqa: B018 (a port out of range raises here)
    except ValueError:
        return f"{url!r} has an invalid port"
    return ""


@register("reward", "remote")
class RemoteReward(RewardModel):
    """A reward served over HTTP by `flowrl serve` (protocol "flowrl") or an OpenAI-style VLM judge ("openai")."""

    @attrs.frozen
    class Config:
        url: str = ""  # the server's base address, e.g. http://127.0.0.1:8700
        protocol: Service = attrs.field(default="flowrl", validator=one_of(Service))
        batch_size: int = attrs.field(default=64, validator=gt(0))  # images per request (openai: always 1)
        concurrency: int = attrs.field(default=1, validator=gt(0))  # requests in flight at once
        timeout_s: float = attrs.field(default=120.0, validator=gt(0))  # per attempt
        retries: int = attrs.field(default=2, validator=ge(0))  # after the first attempt
        backoff_s: float = attrs.field(default=0.5, validator=ge(0))  # wait before retry k: backoff_s * 2^(k-1)
        token_env: str = "FLOWRL_SERVE_TOKEN"  # environment variable holding the bearer token (unset: none)
        encoding: Encoding = attrs.field(default="png", validator=one_of(Encoding))
        expect: str = ""  # flowrl: the reward name the server must report at /health ("" accepts any)
        # flowrl: send each prompt's condition images (flowrl-reward/2), for a served reward that reads them (an
        # edit reward); the server's /health says whether it needs them, and a mismatch is refused at start-up
        conditions: bool = False
        # protocol = "openai" only:
        model: str = ""  # the served model's id ("" takes the first the server lists)
        prompt_template: str = DEFAULT_TEMPLATE  # the judge's question; {prompt} is the image's prompt
        score_regex: str = r"Final Score:\s*([0-9]+(?:\.[0-9]+)?)"  # group 1 is the score
        score_scale: float = 0.2  # the parsed score times this (0.2 maps a 1-5 judge to 0.2-1)
        max_tokens: int = attrs.field(default=512, validator=gt(0))
        on_parse_failure: OnParseFailure = attrs.field(default="error", validator=one_of(OnParseFailure))

    @staticmethod
    def check_config(config: Any) -> Iterable[tuple[str, str]]:
        problem = url_problem(config.url)
        if problem:
            yield ("url", problem)
        if config.protocol == "openai":
            try:
                pattern = re.compile(config.score_regex)
            except re.error as error:
                yield ("score_regex", f"is not a regular expression: {error}")
            else:
                if pattern.groups < 1:
                    yield ("score_regex", "needs a group, e.g. ([0-9.]+), around the score")
            if "{prompt}" not in config.prompt_template:
                yield ("prompt_template", "must contain {prompt} (where the image's prompt goes)")
        if config.expect and config.protocol != "flowrl":
            yield ("expect", "applies to protocol = \"flowrl\" (an OpenAI-style server names its model: set model)")
        if config.conditions and config.protocol != "flowrl":
            yield ("conditions", "applies to protocol = \"flowrl\" (flowrl-reward/2 carries condition images)")

    @classmethod
    def needs_conditions(cls, config: Config) -> bool:
        return bool(config.conditions)  # the server's health must agree (check())

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        c = config
        self.endpoint = Endpoint(c.url, c.timeout_s, c.retries, c.backoff_s, os.environ.get(c.token_env, ""))
        self.health: dict[str, Any] = {}
        self.components: dict[str, Tensor] = {}  # the named components of the last score() (flowrl protocol)
        self.judge = JudgeSettings(c.model, c.prompt_template, c.score_regex, c.score_scale, c.max_tokens,
                                   c.on_parse_failure)

    @property
    def label(self) -> str:
        return f"reward '{self.registered_name or 'remote'}'"

    # -- start-up -----------------------------------------------------------------------------------
    def check(self) -> None:
        """Ask the server's health (one attempt more than none: a server still starting gets ``retries``);
        a :class:`RewardConfigError` (exit status 2) naming the address when it does not answer as expected."""
        for problem in self.check_config(self.config):
            raise RewardConfigError(f"{self.label}: reward.{problem[0]} {problem[1]}")
        try:
            if self.config.protocol == "openai":
                self.health = judge_health(self.endpoint, self.judge)
            else:
                self.health = self.endpoint.get("/health")
        except RewardServerUnavailable as error:  # nothing answered: the server is down or the address wrong
            start = "start it (`flowrl serve REWARD --port PORT`)" if self.config.protocol == "flowrl" else "start it"
            raise RewardConfigError(f"{self.label}: {error}; {start} or fix reward.url") from None
        except RemoteRewardError as error:  # it answered, and refused (a 401 names the token): its own advice
            raise RewardConfigError(f"{self.label}: {error}") from None
        if self.config.protocol == "flowrl":
            self._check_flowrl_health()

    def _check_flowrl_health(self) -> None:
        found = self.health if isinstance(self.health, dict) else {}
        where = f"{self.endpoint.url}/health"
        if found.get("protocol") not in PROTOCOLS:
            raise RewardConfigError(f"{self.label}: {where} does not speak {PROTOCOL} (it answered "
                                    f"{str(self.health)[:120]!r}); an OpenAI-style server: protocol = \"openai\"")
        speaks = found.get("protocols", [found.get("protocol")])
        if found.get("needs_conditions") and not self.config.conditions:
            raise RewardConfigError(f"{self.label}: the server at {self.endpoint.url} serves reward "
                                    f"{found.get('reward')!r}, which needs each prompt's condition images; set "
                                    "reward.conditions = true (with prompts that carry them: an edit task)")
        if self.config.conditions and PROTOCOL_CONDITIONS not in speaks:
            raise RewardConfigError(f"{self.label}: the server at {self.endpoint.url} takes no condition images "
                                    f"(it speaks {', '.join(map(str, speaks))}, not {PROTOCOL_CONDITIONS}); set "
                                    "reward.conditions = false")
        if self.config.encoding not in found.get("encodings", ENCODINGS):
            raise RewardConfigError(f"{self.label}: the server at {self.endpoint.url} does not take encoding "
                                    f"{self.config.encoding!r} (it takes {found.get('encodings')})")
        if self.config.expect and found.get("reward") != self.config.expect:
            raise RewardConfigError(f"{self.label}: the server at {self.endpoint.url} serves reward "
                                    f"{found.get('reward')!r}, not {self.config.expect!r} (reward.expect)")

    # -- scoring ------------------------------------------------------------------------------------
    def _limit(self) -> int | None:
        """The server's body limit (``max_body_bytes`` at /health), when check() read it."""
        limit = self.health.get("max_body_bytes") if isinstance(self.health, dict) else None
        return limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else None

    def _chunks(self, n: int) -> list[slice]:
        size = 1 if self.config.protocol == "openai" else self.config.batch_size
        return [slice(i, min(i + size, n)) for i in range(0, n, size)]

    def _map(self, fn: Callable[[slice], Any], chunks: list[slice]) -> list[Any]:
        if self.config.concurrency == 1 or len(chunks) == 1:
            return [fn(chunk) for chunk in chunks]
        with ThreadPoolExecutor(max_workers=min(self.config.concurrency, len(chunks))) as pool:
            return list(pool.map(fn, chunks))

    def score(self, images: Tensor, prompts: list[str]) -> Tensor:
        if len(prompts) != images.shape[0]:
            raise ValueError(f"{images.shape[0]} images but {len(prompts)} prompts")
        chunks = self._chunks(images.shape[0])
        if self.config.protocol == "openai":
            if not self.health:  # the model to ask (check() found it; a reward built without check() asks now)
                self.health = judge_health(self.endpoint, self.judge)
            model = self.health["model"]
            found = self._map(lambda s: (judge_score(self.endpoint, self.judge, model, images[s][0], prompts[s][0]),
                                         {}), chunks)
        else:
            found = self._map(lambda s: self._score_chunk(images[s], prompts[s]), chunks)
        names = set(found[0][1]) if found else set()
        self.components = {k: torch.cat([part[1][k] for part in found]) for k in names
                           if all(k in part[1] for part in found)}
        return torch.cat([part[0] for part in found]).float()

    def _score_chunk(self, images: Tensor, prompts: list[str]) -> tuple[Tensor, dict[str, Tensor]]:
        body = score_request(images, prompts, self.config.encoding, conditions=self.config.conditions)
        answer = self.endpoint.post("/score", body, self._limit())
        try:
            return parse_score_answer(answer, images.shape[0])
        except WireError as error:
            raise RemoteRewardError(f"reward server {self.endpoint.url}/score sent a malformed answer: {error}") \
                from None

    def eval_metrics(self, images: Tensor, prompts: list[str]) -> dict[str, float]:
        """flowrl protocol: the served reward's own evaluation figures (``/metrics``, the whole evaluation batch
        in one request, so figures that are not means come out as in process); openai: the mean score."""
        if self.config.protocol == "openai":
            return super().eval_metrics(images, prompts)
        body = score_request(images, prompts, self.config.encoding, conditions=self.config.conditions)
        answer = self.endpoint.post("/metrics", body, self._limit())
        try:
            return parse_metrics_answer(answer)
        except WireError as error:
            raise RemoteRewardError(f"reward server {self.endpoint.url}/metrics sent a malformed answer: {error}") \
                from None


def server_problems(recipe: Any) -> Iterable[tuple[str, str]]:
    """``flowrl validate``'s look at served rewards: the server of each ``remote`` reward, or of any reward class
    that sets ``asks_a_server = True`` (``edit_judge``), answers its health check (``(key, message)`` pairs, as a
    recipe's other problems)."""
    for i, part in enumerate(recipe.rewards):
        if isinstance(part.cls, type) and (issubclass(part.cls, RemoteReward) or getattr(part.cls, "asks_a_server",
                                                                                            False)):
            label = f"reward[{i}]" if len(recipe.rewards) > 1 else "reward"
            try:
                part.build().check()
            except RewardConfigError as error:
                yield (f"{label}.url", str(error))
