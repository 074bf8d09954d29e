"""``protocol = "openai"``: a vision-language judge behind an OpenAI-style ``/v1/chat/completions`` server
(vLLM's or SGLang's ``--api-key`` servers, as the peers run UnifiedReward).

What differs from ``flowrl serve``: one image per request (a chat is one conversation), the image goes as a
``data:image/png;base64`` URL inside the user message next to the question (``prompt_template`` with the image's
prompt in it), and the score is whatever the model writes, read with ``score_regex`` (group 1) and multiplied
by ``score_scale``. The health check is ``GET /v1/models``. There are no named components and no evaluation
figures of the server's own (the mean score is the evaluation figure). A reply the regex does not match is an error
unless ``on_parse_failure = "zero"`` (the peers' silent 0 hides a broken judge).
"""

from __future__ import annotations

import math
import re
from typing import Any

import attrs
from torch import Tensor

from flowrl.rewards.http import Endpoint, RemoteRewardError
from flowrl.rewards.wire import encode_image

DEFAULT_TEMPLATE = (
    "You are given an image generated from the text prompt: \"{prompt}\". Rate how well the image matches the "
    "prompt and how good it looks, from 1 (poor) to 5 (excellent). End your answer with 'Final Score: N'."
)


@attrs.frozen
class JudgeSettings:
    model: str
    template: str
    regex: str
    scale: float
    max_tokens: int
    on_parse_failure: str


def judge_health(endpoint: Endpoint, judge: JudgeSettings | str) -> dict[str, Any]:
    """``GET /v1/models``; the configured model (``judge.model``, or a model name) must be among those served (an
    empty one takes the first)."""
    wanted = judge if isinstance(judge, str) else judge.model
    found = endpoint.get("/v1/models")
    ids = [m.get("id") for m in found.get("data", [])] if isinstance(found, dict) else []
    if not ids or not all(isinstance(i, str) for i in ids):
        raise RemoteRewardError(f"{endpoint.url}/v1/models lists no model (not an OpenAI-style server?)")
    if wanted and wanted not in ids:
        raise RemoteRewardError(f"{endpoint.url} serves {', '.join(ids)}, not the model {wanted!r} (reward.model)")
    return {"models": ids, "model": wanted or ids[0]}


def png_part(data: str) -> dict[str, Any]:
    """A message part holding one base64 PNG as a ``data:`` URL."""
    return {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}}


def chat_body(model: str, images: list[str], text: str, max_tokens: int, temperature: float = 0.0,
              top_logprobs: int = 0) -> dict[str, Any]:
    """A chat-completions body: one user message of the base64 PNG ``images`` (in order), then ``text``; with
    ``top_logprobs > 0`` it asks for each answer token's log-probability and that many alternatives."""
    content = [*(png_part(data) for data in images), {"type": "text", "text": text}]
    body = {"model": model, "messages": [{"role": "user", "content": content}], "temperature": temperature,
            "max_tokens": max_tokens}
    if top_logprobs > 0:
        body.update(logprobs=True, top_logprobs=top_logprobs)
    return body


def chat_request(judge: JudgeSettings, model: str, image: Tensor, prompt: str) -> dict[str, Any]:
    """The chat-completions body asking the judge about one image."""
    data = encode_image(image, "png")["data"]
    return chat_body(model, [data], judge.template.replace("{prompt}", prompt), judge.max_tokens)


def ask(endpoint: Endpoint, body: dict[str, Any]) -> tuple[str, Any]:
    """POST ``body`` to ``/v1/chat/completions``: the reply's text and the whole answer; a malformed answer is a
    :class:`RemoteRewardError` naming the server."""
    answer = endpoint.post("/v1/chat/completions", body)
    try:
        return reply_text(answer), answer
    except ValueError as error:
        raise RemoteRewardError(f"judge {endpoint.url}/v1/chat/completions sent a malformed answer: {error}") from None


def reply_text(answer: Any) -> str:
    """The first choice's message text, or :class:`RemoteRewardError`-worthy ``ValueError``."""
    try:
        text = answer["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise ValueError("the answer has no choices[0].message.content") from None
    if not isinstance(text, str):
        raise ValueError("choices[0].message.content is not text")
    return text


def parse_score(judge: JudgeSettings, text: str) -> float | None:
    """``scale`` times the number in group 1 of the regex's first match; None without a match."""
    match = re.search(judge.regex, text)
    if match is None:
        return None
    try:
        value = float(match.group(1))
    except (TypeError, ValueError):
        return None
    return value * judge.scale if math.isfinite(value) else None


def judge_score(endpoint: Endpoint, judge: JudgeSettings, model: str, image: Tensor, prompt: str) -> Tensor:
    """The judge's (``model`` at ``endpoint``) score of one image as a ``(1,)`` tensor."""
    import torch

    text, _ = ask(endpoint, chat_request(judge, model, image, prompt))
    value = parse_score(judge, text)
    if value is None:
        if judge.on_parse_failure != "zero":
            raise RemoteRewardError(f"judge {endpoint.url}: reply {text[-160:]!r} does not match score_regex "
                                    f"{judge.regex!r} (set on_parse_failure = \"zero\" to score such replies 0)")
        value = 0.0
    return torch.tensor([value], dtype=torch.float32)
