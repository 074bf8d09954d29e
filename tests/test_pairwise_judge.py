"""The OpenAI-style pairwise judge (``[reward.judge] type = "openai"``) against a real HTTP server on 127.0.0.1 that
stands in for a VLM (:func:`pair_judge_app`: the brighter image wins): what each request carries, how
verdicts are read, unreadable replies, a server that is down or serves another model, condition images, the
conformance rules, and the settings refused at load."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import ROOT
from fastapi import FastAPI, Request
from served import free_port, in_thread

import flowrl
from flowrl import RecipeError
from flowrl.config.recipe import load_recipe
from flowrl.conformance import check_judge
from flowrl.core.conditions import Condition, Prompt
from flowrl.rewards.base import RewardConfigError
from flowrl.rewards.http import RemoteRewardError
from flowrl.rewards.wire import decode_image, png_roundtrip


def pair_judge_app() -> FastAPI:
    """A stand-in for a pairwise VLM judge behind an OpenAI-style server (vLLM serving UnifiedReward-Think): it
    decodes the last two images of each request and prefers the brighter, answering in both shipped verdict forms
    (``Better: Image N`` and ``<answer>Image N is better</answer>``); images of equal brightness get a reply without
    a verdict. It keeps the requests it got (``app.state.seen``)."""
    app = FastAPI()
    app.state.seen = []

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": "judge-7b", "object": "model"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict:
        body = await request.json()
        app.state.seen.append(body)
        urls = [part["image_url"]["url"] for part in body["messages"][0]["content"] if part["type"] == "image_url"]
        first, second = (float(decode_image({"encoding": "png", "data": u.split(",", 1)[1]}, 0).mean())
                         for u in urls[-2:])
        better = 1 if first > second else 2 if second > first else 0
        text = (f"<think>Image 1: {first:.3f}, Image 2: {second:.3f}</think>\n<answer>Image {better} is better</answer>"
                f"\nBetter: Image {better}") if better else "Both look the same to me."
        return {"id": "x", "object": "chat.completion", "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}

    return app


FAST = {"retries": 0, "backoff_s": 0.01, "timeout_s": 10.0}
FLUX = ROOT / "recipes" / "flux" / "pref_grpo_unifiedreward.toml"


def win_rate(url: str, both_orders: bool = False, **judge: object) -> object:
    return flowrl.build("reward", {"type": "pairwise_win_rate", "both_orders": both_orders,
                                   "judge": {"type": "openai", "url": url, **FAST, **judge}})


def greys(*values: float) -> torch.Tensor:
    """Flat images of these grey levels, multiples of 1/255 (so that PNG keeps them exactly)."""
    return torch.stack([torch.full((3, 6, 5), round(v * 255) / 255) for v in values])


def image_of(part: dict) -> torch.Tensor:
    return decode_image({"encoding": "png", "data": part["image_url"]["url"].split(",", 1)[1]}, 0)


def test_each_pair_is_one_request_with_both_images_in_order() -> None:
    app = pair_judge_app()
    images = greys(0.2, 0.8, 0.5)
    with in_thread(app) as server:
        reward = win_rate(server.url, prompt_template="Which shows {prompt}? Say 'Better: Image N'.")
        reward.check()
        scores = reward.score(images, ["a red circle"] * 3)
    assert scores.tolist() == [0.0, 1.0, 0.5]  # 0.8 beats both, 0.5 beats 0.2
    assert len(app.state.seen) == 3  # G (G - 1) / 2 requests
    pairs = []
    for body in app.state.seen:
        assert body["model"] == "judge-7b" and body["temperature"] == 0 and body["max_tokens"] == 1024
        *pictures, text = body["messages"][0]["content"]
        assert text == {"type": "text", "text": "Which shows a red circle? Say 'Better: Image N'."}
        pairs.append(tuple(round(float(image_of(p).mean()) * 255) for p in pictures))
    assert sorted(pairs) == [(51, 128), (51, 204), (204, 128)]  # (0, 1), (0, 2), (1, 2): earlier image first
    sent = {round(float(image_of(p).mean()) * 255): image_of(p) for b in app.state.seen
            for p in b["messages"][0]["content"][:2]}  # the requests run concurrently: found by grey level
    assert all(torch.equal(sent[level], png_roundtrip(images[k : k + 1])[0]) for k, level in enumerate((51, 204, 128)))


def test_both_orders_asks_every_pair_twice_and_a_fair_judge_agrees_with_itself() -> None:
    app = pair_judge_app()
    images = greys(0.2, 0.8, 0.5, 0.4)
    with in_thread(app) as server:
        once = win_rate(server.url).score(images, ["p"] * 4)
        twice = win_rate(server.url, both_orders=True).score(images, ["p"] * 4)
    assert len(app.state.seen) == 6 + 12
    assert torch.equal(once, twice) and float(once.sum()) == 2.0


def test_a_reply_without_a_verdict_is_a_tie_or_an_error_when_asked() -> None:
    """Equal images get a reply the stand-in gives no verdict in: a tie (the release's rule), counted."""
    images = greys(0.5, 0.5, 0.9)
    with in_thread(pair_judge_app()) as server:
        lenient = win_rate(server.url)
        assert lenient.score(images, ["p"] * 3).tolist() == [0.25, 0.25, 1.0]
        assert lenient.judge.unreadable == 1
        strict = win_rate(server.url, on_parse_failure="error")
        with pytest.raises(RemoteRewardError, match="has no verdict matching verdict_regex"):
            strict.score(images, ["p"] * 3)


def test_the_release_answer_form_is_read_with_its_regex() -> None:
    recipe = load_recipe(FLUX)
    judge = dict(recipe.rewards[0].config.judge)
    with in_thread(pair_judge_app()) as server:
        reward = flowrl.build("reward", {"type": "pairwise_win_rate", "judge": {**judge, "url": server.url, **FAST}})
        assert reward.score(greys(0.9, 0.1), ["p", "p"]).tolist() == [1.0, 0.0]
        assert reward.judge.verdict("<think>Image 1 is better at colour</think><answer>Image 2 is better</answer>") == 0
        assert reward.judge.verdict("<answer>Image 3 is better</answer>") is None  # a label the judge does not use


def test_a_server_that_is_down_or_serves_another_model_is_refused_at_check() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(RewardConfigError, match=f"judge 'openai': reward server {url}/v1/models did not answer"):
        win_rate(url).check()
    with in_thread(pair_judge_app()) as server, pytest.raises(RewardConfigError, match="not the model 'other'"):
        win_rate(server.url, model="other").check()


def test_condition_images_go_first_when_asked() -> None:
    app = pair_judge_app()
    source = Condition(torch.full((4, 4), 30, dtype=torch.uint8).numpy(), "L")
    prompt = Prompt("make it brighter", [source])
    with in_thread(app) as server:
        reward = win_rate(server.url, conditions=True)
        assert type(reward).needs_conditions(reward.config)
        assert reward.score(greys(0.3, 0.6), [prompt, prompt]).tolist() == [0.0, 1.0]
    content = app.state.seen[0]["messages"][0]["content"]
    assert len(content) == 4  # the source, the two results, the question
    assert torch.equal(image_of(content[0]), torch.full((3, 4, 4), 30 / 255))  # grey repeated to RGB


def test_the_openai_judge_conforms() -> None:
    first = greys(0.1, 0.6, 0.3)
    with in_thread(pair_judge_app()) as server:
        judge = flowrl.build("judge", {"type": "openai", "url": server.url, **FAST})
        verdicts = check_judge(judge, first, greys(0.5, 0.2, 0.3), ["a", "b", "c"])
    assert verdicts.tolist() == [0.0, 1.0, 0.5]


@pytest.mark.parametrize(("override", "key", "says"), [
    ("reward.judge.verdict_regex=\"Image [12]\"", "reward[0].judge.verdict_regex", "needs a group"),
    ("reward.judge.verdict_regex=\"(\"", "reward[0].judge.verdict_regex", "is not a regular expression"),
    ("reward.judge.prompt_template=\"Which is better?\"", "reward[0].judge.prompt_template", "must contain {prompt}"),
    ("reward.judge.second_label=\"1\"", "reward[0].judge.second_label", "must be distinct"),
    ("reward.judge.url=\"127.0.0.1:8080\"", "reward[0].judge.url", "is not an http:// or https:// address"),
])
def test_bad_judge_settings_are_one_line_naming_the_key(override: str, key: str, says: str, tmp_path: Path) -> None:
    with pytest.raises(RecipeError) as caught:
        load_recipe(FLUX, [override])
    problems = caught.value.problems
    assert [k for k, _ in problems] == [key] and says in problems[0][1] and "\n" not in problems[0][1]
