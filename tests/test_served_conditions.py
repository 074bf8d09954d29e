"""Served rewards carry conditions: the wire format's version 2 (each prompt's condition images) against real servers
on 127.0.0.1 (uvicorn in a thread). An edit reward served scores as in process; a text-only server keeps working;
a server that needs conditions says so; size limits and bad payloads are one-line errors on both sides."""

from __future__ import annotations

import base64
import io
import json
import urllib.error
import urllib.request

import numpy as np
import pytest
import torch
from conftest import tiny_recipe
from fastapi import FastAPI
from PIL import Image
from served import Brightness, in_thread, reward_in_thread

from flowrl.config.condition_checks import reward_condition_problems
from flowrl.config.recipe import recipe_from_dict
from flowrl.core.conditions import Condition, Prompt, conditions_of
from flowrl.rewards.base import RewardConfigError
from flowrl.rewards.http import RemoteRewardError
from flowrl.rewards.remote import RemoteReward
from flowrl.rewards.wire import (
    MAX_CONDITIONS,
    MAX_SIDE,
    PROTOCOL,
    PROTOCOL_CONDITIONS,
    WireError,
    encode_condition,
    parse_request,
    score_request,
)
from flowrl.world.edit import enumerate_edits
from flowrl.world.edit_components import WorldEditVerifier
from flowrl.world.edit_render import render_edit_batch

FAST = {"retries": 0, "backoff_s": 0.01, "timeout_s": 10.0}


def remote(url: str, **settings: object) -> RemoteReward:
    return RemoteReward(RemoteReward.Config(url=url, **{**FAST, **settings}))  # type: ignore[arg-type]


def edits(count: int = 5) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """Sources and targets ``(B, 3, 32, 32)`` of train edits, and their prompts (instructions with the sources)."""
    chosen = enumerate_edits("train")[::500][:count]
    sources, targets = render_edit_batch(chosen, seed=3)
    prompts = [Prompt(e.text, [Condition(s)]) for e, s in zip(chosen, sources, strict=True)]
    as_tensor = lambda a: torch.from_numpy(a).permute(0, 3, 1, 2).float() / 255  # noqa: E731
    return as_tensor(sources), as_tensor(targets), prompts


def post(url: str, body: object) -> tuple[int, str]:
    data = json.dumps(body).encode()
    request = urllib.request.Request(f"{url}/score", data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())["error"]


def png(array: np.ndarray, mode: str | None = None) -> dict:
    buffer = io.BytesIO()
    Image.fromarray(array, mode=mode).save(buffer, format="PNG")
    return {"encoding": "png", "data": base64.b64encode(buffer.getvalue()).decode()}


def test_condition_images_travel_losslessly_in_their_size_and_mode() -> None:
    rng = np.random.default_rng(0)
    rgb = Condition(rng.integers(0, 256, (5, 7, 3), dtype=np.uint8))
    rgba = Condition(rng.integers(0, 256, (4, 4, 4), dtype=np.uint8), "RGBA")
    grey = Condition(rng.integers(0, 256, (3, 9), dtype=np.uint8), "L")
    prompts = [Prompt("make the red circle green", [rgb]), Prompt("two", [rgba, grey]), "a red circle"]
    body = json.loads(json.dumps(score_request(torch.rand(3, 3, 4, 4), prompts, "png", conditions=True)))
    assert body["protocol"] == PROTOCOL_CONDITIONS and [len(c) for c in body["conditions"]] == [1, 2, 0]
    _, decoded, _ = parse_request(body)
    assert decoded == prompts  # equal by text and by the images' contents
    assert [c.mode for c in conditions_of(decoded[1])] == ["RGBA", "L"] and type(decoded[2]) is str
    plain = score_request(torch.rand(2, 3, 4, 4), prompts[:2], "png")  # version 1: as before, text only
    assert plain["protocol"] == PROTOCOL and "conditions" not in plain
    assert parse_request(plain)[1] == ["make the red circle green", "two"]


def test_an_edit_reward_served_scores_as_in_process() -> None:
    sources, targets, prompts = edits()
    here = WorldEditVerifier(WorldEditVerifier.Config())
    with reward_in_thread(WorldEditVerifier(WorldEditVerifier.Config()), "world_edit_verifier") as server:
        reward = remote(server.url, conditions=True)
        reward.check()
        assert reward.health["protocol"] == PROTOCOL_CONDITIONS and reward.health["needs_conditions"] is True
        images = torch.cat([targets, sources])
        both = prompts + prompts
        assert torch.equal(reward.score(images, both), here.score(images, both))
        assert torch.equal(reward.score(targets, prompts), torch.ones(len(prompts)))
        assert reward.eval_metrics(images, both) == pytest.approx(here.eval_metrics(images, both))
        with pytest.raises(RewardConfigError, match=r"which needs each prompt's condition images; set "
                                                    r"reward.conditions = true"):
            remote(server.url).check()  # a client that would not send them is refused at start-up
        status, message = post(server.url, score_request(targets[:1], [str(prompts[0])], "png"))
        assert (status, message) == (400, "reward 'world_edit_verifier' needs each prompt's condition images "
                                          f"(protocol '{PROTOCOL_CONDITIONS}' with 'conditions'); prompts[0] has none")


def test_a_text_only_server_keeps_working_on_an_edit_task() -> None:
    _, targets, prompts = edits()
    with reward_in_thread(Brightness(Brightness.Config())) as server:
        reward = remote(server.url)
        reward.check()
        assert reward.health["protocol"] == PROTOCOL and reward.health["needs_conditions"] is False
        expected = targets.mean(dim=(1, 2, 3))
        assert torch.allclose(reward.score(targets, prompts), expected, atol=1e-6)  # the result alone
        sending = remote(server.url, conditions=True)  # it reads version 2 too, and leaves them unread
        sending.check()
        assert torch.allclose(sending.score(targets, prompts), expected, atol=1e-6)


def test_a_version_1_server_is_refused_only_when_conditions_must_go() -> None:
    app = FastAPI()

    @app.get("/health")
    async def health() -> dict:  # what a server of the first version answers
        return {"protocol": PROTOCOL, "reward": "old", "encodings": ["png", "float32"]}

    with in_thread(app) as server:
        remote(server.url).check()
        with pytest.raises(RewardConfigError, match=f"takes no condition images .it speaks {PROTOCOL}, not "
                                                    f"{PROTOCOL_CONDITIONS}.; set reward.conditions = false"):
            remote(server.url, conditions=True).check()


def test_bad_payloads_are_one_line_400s_and_the_server_keeps_serving() -> None:
    _, targets, prompts = edits(1)
    good = score_request(targets, prompts, "png", conditions=True)
    source = good["conditions"][0][0]
    with reward_in_thread(WorldEditVerifier(WorldEditVerifier.Config()), "edit", max_body_bytes=200_000) as server:
        cases = [
            ({**good, "protocol": PROTOCOL}, f"'conditions' needs protocol '{PROTOCOL_CONDITIONS}'"),
            ({k: v for k, v in good.items() if k != "conditions"}, "'conditions' must be a list with one list"),
            ({**good, "conditions": [source]}, "conditions[0] must be a list of images"),
            ({**good, "conditions": [[{"encoding": "png", "data": "%%"}]]}, "conditions[0][0].data is not valid"),
            ({**good, "conditions": [[{"encoding": "png", "data": "aGVsbG8="}]]}, "conditions[0][0] is not a readable"),
            ({**good, "conditions": [[{**source, "encoding": "float32"}]]}, "conditions[0][0].encoding must be 'png'"),
            ({**good, "conditions": [[source] * (MAX_CONDITIONS + 1)]}, f"conditions[0] holds {MAX_CONDITIONS + 1}"),
            ({**good, "conditions": [[png(np.zeros((1, MAX_SIDE + 1, 3), np.uint8))]]}, "conditions[0][0]: a 8193x1"),
            ({**good, "conditions": [[png(np.zeros((4, 4), np.uint8), "P")]]}, "conditions[0][0]: a P PNG"),
            ({**good, "protocol": "flowrl-reward/9"}, "protocol 'flowrl-reward/9' is not one of"),
        ]
        for body, start in cases:
            status, message = post(server.url, body)
            assert status == 400 and message.startswith(start) and "\n" not in message, (start, message)
        noise = np.random.default_rng(0).integers(0, 256, (300, 300, 3), dtype=np.uint8)  # a PNG of ~270 kB
        assert post(server.url, {**good, "conditions": [[png(noise)]]})[0] == 413  # over the server's body limit
        assert post(server.url, good) == (200, '{"scores":[1.0]}')  # still serving


def test_the_client_refuses_what_the_server_could_not_take_before_sending() -> None:
    _, targets, prompts = edits(2)
    with reward_in_thread(WorldEditVerifier(WorldEditVerifier.Config()), "edit", max_body_bytes=1_000) as server:
        reward = remote(server.url, conditions=True, batch_size=2)
        reward.check()
        with pytest.raises(RemoteRewardError, match=r"of \d+ bytes is over the server's limit of 1000 bytes"):
            reward.score(targets, prompts)
        assert reward.endpoint.attempts == 1  # the health check only: nothing was sent
    with pytest.raises(WireError, match=f"larger than the protocol's {MAX_SIDE} px"):
        encode_condition(Condition(np.zeros((1, MAX_SIDE + 1, 3), np.uint8)))


def test_validate_refuses_a_served_edit_reward_on_text_prompts() -> None:
    base = {
        "backbone": {"type": "world_tiny"}, "prompts": {"type": "world", "eval_count": 5},
        "reward": [{"type": "remote", "url": "http://127.0.0.1:1", "conditions": True}],
    }
    data = {**tiny_recipe(), **base}
    ((key, message),) = reward_condition_problems(recipe_from_dict(data))
    assert key == "reward" and message.startswith("'remote' needs each prompt's condition images")
    data["reward"] = [{"type": "remote", "url": "http://127.0.0.1:1"}]
    assert reward_condition_problems(recipe_from_dict(data)) == []
    problems = list(RemoteReward.check_config(RemoteReward.Config(url="http://127.0.0.1:1", protocol="openai",
                                                                  conditions=True)))
    assert ("conditions", 'applies to protocol = "flowrl" (flowrl-reward/2 carries condition images)') in problems

