"""The `remote` reward against real HTTP servers on 127.0.0.1 (uvicorn in a thread of the test process): the wire
format, parity with the reward in process, retries, refusals, malformed answers, auth, the server's own
refusals, the OpenAI-style judge protocol, and the checkpoint a run leaves when its server goes away."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
import torch
from conftest import tiny_recipe
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from safetensors.torch import load_file
from served import Brightness, free_port, in_thread, reward_in_thread, tiny_world

from flowrl.config.recipe import recipe_from_dict
from flowrl.core.interfaces import RewardError
from flowrl.rewards.base import RewardConfigError
from flowrl.rewards.http import RemoteRewardError, RewardServerUnavailable
from flowrl.rewards.remote import RemoteReward
from flowrl.rewards.wire import decode_image, encode_image, png_roundtrip, score_request
from flowrl.trainer import train
from flowrl.world.components import WorldVerifier

FAST = {"retries": 1, "backoff_s": 0.01, "timeout_s": 5.0}


def remote(url: str, **settings: object) -> RemoteReward:
    return RemoteReward(RemoteReward.Config(url=url, **{**FAST, **settings}))  # type: ignore[arg-type]


def test_images_travel_losslessly() -> None:
    images = torch.rand(2, 3, 5, 7, generator=torch.Generator().manual_seed(0))
    exact = decode_image(encode_image(images[0], "float32"), 0)
    assert torch.equal(exact, images[0])  # the same float32 bytes
    png = decode_image(encode_image(images[1], "png"), 0)
    assert torch.equal(png, png_roundtrip(images[1:])[0])  # lossless for the 8-bit image


@pytest.mark.parametrize("encoding", ["float32", "png"])
def test_served_world_verifier_scores_as_in_process(encoding: str) -> None:
    images, prompts = tiny_world()
    here = WorldVerifier(WorldVerifier.Config())
    with reward_in_thread(WorldVerifier(WorldVerifier.Config()), "world_verifier") as server:
        reward = remote(server.url, encoding=encoding, batch_size=4, expect="world_verifier")
        reward.check()
        got = reward.score(images, prompts)  # two requests of 4 and 2 images
        figures = reward.eval_metrics(images, prompts)
    seen = images if encoding == "float32" else png_roundtrip(images)
    assert torch.equal(got, here.score(seen, prompts))  # exact: the same verifier on the same pixels
    assert got[:-1].min() > 0  # the rendered scenes meet their prompts: not a vacuous equality of zeros
    assert figures == pytest.approx(here.eval_metrics(seen, prompts), abs=0, rel=0)


def test_a_server_that_is_down_is_refused_at_check_naming_the_address(tmp_path: Path, capsys) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(RewardConfigError, match=f"{url}/health did not answer"):
        remote(url).check()
    from flowrl.cli.main import main

    recipe = tmp_path / "r.toml"
    recipe.write_text((Path("recipes/flow_grpo_remote.toml").read_text()).replace("http://127.0.0.1:8700", url))
    assert main(["validate", str(recipe), "--set", "reward.retries=0"]) == 2
    assert f"{url}/health did not answer" in capsys.readouterr().out


def test_check_refuses_a_server_of_another_reward() -> None:
    wrong = "serves reward 'brightness', not 'world_verifier'"
    with reward_in_thread(Brightness(Brightness.Config()), "brightness") as server, \
            pytest.raises(RewardConfigError, match=wrong):
        remote(server.url, expect="world_verifier").check()


def stand_in(answer: object, status: int = 200, raw: str | None = None) -> FastAPI:
    """A server that answers every /score with ``answer`` (or the text ``raw``), counting the requests."""
    app = FastAPI()
    app.state.requests = 0

    @app.post("/score")
    async def score(request: Request) -> object:
        app.state.requests += 1
        if raw is not None:
            return PlainTextResponse(raw, status_code=status)
        return JSONResponse(answer, status_code=status)

    return app


@pytest.mark.parametrize(
    ("answer", "raw", "message"),
    [
        ({"scores": [1.0]}, None, "'scores' holds 1 values for 2 images"),
        ({"scores": [1.0, None]}, None, r"scores\[1\] is null"),
        (None, '{"scores": [1.0, NaN]}', "NaN, which JSON does not allow"),
        (None, "<html>oops</html>", "not JSON"),
        ({"result": [1, 2]}, None, "must be a JSON object with 'scores'"),
        ({"scores": [1.0, "2"]}, None, r"scores\[1\] is '2', not a number"),
    ],
)
def test_a_malformed_answer_fails_at_once_naming_the_server(answer: object, raw: str | None, message: str) -> None:
    app = stand_in(answer, raw=raw)
    with in_thread(app) as server:
        reward = remote(server.url, retries=3)
        with pytest.raises(RemoteRewardError, match=message) as caught:
            reward.score(torch.zeros(2, 3, 4, 4), ["a", "b"])
    assert server.url in str(caught.value)
    assert not isinstance(caught.value, RewardServerUnavailable)
    assert app.state.requests == 1  # a malformed answer is never retried


def test_a_4xx_is_not_retried_a_5xx_is_then_the_server_is_unavailable() -> None:
    refused = stand_in({"error": "bad field"}, status=422)
    with in_thread(refused) as server, pytest.raises(RemoteRewardError, match="HTTP 422: bad field"):
        remote(server.url, retries=3).score(torch.zeros(1, 3, 4, 4), ["a"])
    assert refused.state.requests == 1
    failing = stand_in({"error": "out of memory"}, status=503)
    gone = r"HTTP 503: out of memory; 3 attempts"
    with in_thread(failing) as server, pytest.raises(RewardServerUnavailable, match=gone):
        remote(server.url, retries=2).score(torch.zeros(1, 3, 4, 4), ["a"])
    assert failing.state.requests == 3


def test_a_failing_reward_is_retried_with_backoff_and_then_scores() -> None:
    reward = Brightness(Brightness.Config(fail_first=2))
    with reward_in_thread(reward) as server:
        client = remote(server.url, retries=2, backoff_s=0.05, encoding="float32")
        start = time.perf_counter()
        got = client.score(torch.full((2, 3, 4, 4), 0.5), ["a", "b"])
        waited = time.perf_counter() - start
    assert torch.equal(got, torch.tensor([0.5, 0.5])) and client.endpoint.attempts == 3
    assert waited >= 0.05 + 0.1  # backoff 0.05 s, then 0.1 s


def test_a_slow_server_times_out_and_the_retry_gets_the_answer() -> None:
    reward = Brightness(Brightness.Config(delay_s=0.4))
    with reward_in_thread(reward) as server:
        client = remote(server.url, timeout_s=0.15, retries=1)
        with pytest.raises(RewardServerUnavailable, match="no answer within timeout_s = 0.15; 2 attempts"):
            client.score(torch.zeros(1, 3, 4, 4), ["a"])
        patient = remote(server.url, timeout_s=5.0)
        assert torch.equal(patient.score(torch.zeros(1, 3, 4, 4), ["a"]), torch.zeros(1))


def test_the_token_is_required_and_a_401_is_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    with reward_in_thread(Brightness(Brightness.Config()), token="s3cret") as server:
        monkeypatch.delenv("FLOWRL_SERVE_TOKEN", raising=False)
        anonymous = remote(server.url, retries=3)
        with pytest.raises(RewardConfigError, match="HTTP 401") as refused:
            anonymous.check()
        assert anonymous.endpoint.attempts == 1
        assert "token" in str(refused.value) and "start it" not in str(refused.value)  # it answered: no "start it"
        monkeypatch.setenv("MY_TOKEN", "s3cret")
        allowed = remote(server.url, token_env="MY_TOKEN")
        allowed.check()
        assert torch.equal(allowed.score(torch.ones(1, 3, 2, 2), ["a"]), torch.ones(1))


def test_the_server_refuses_oversized_and_malformed_requests_and_keeps_serving() -> None:
    import urllib.error
    import urllib.request

    def post(url: str, data: bytes) -> tuple[int, str]:
        request = urllib.request.Request(f"{url}/score", data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())["error"]

    good = score_request(torch.zeros(1, 3, 4, 4), ["a"], "png")
    with reward_in_thread(Brightness(Brightness.Config()), max_body_bytes=10_000) as server:
        assert post(server.url, json.dumps(score_request(torch.rand(1, 3, 64, 64), ["a"], "float32")).encode())[0] \
            == 413
        assert post(server.url, b"{not json")[0] == 400
        assert post(server.url, json.dumps({**good, "prompts": ["a", "b"]}).encode()) == (400, "1 images but 2 prompts")
        bad_png = {**good, "images": [{"encoding": "png", "data": "aGVsbG8="}]}
        assert post(server.url, json.dumps(bad_png).encode()) == (400, "images[0] is not a readable PNG "
                                                                   "(UnidentifiedImageError)")
        huge = {**good, "images": [{"encoding": "float32", "shape": [3, 100000, 1], "data": ""}]}
        assert post(server.url, json.dumps(huge).encode())[0] == 400
        assert post(server.url, json.dumps(good).encode()) == (200, '{"scores":[0.0]}')  # still serving


def judge_app(replies: list[str]) -> FastAPI:
    """A stand-in for an OpenAI-style VLM server (vLLM, SGLang): /v1/models and /v1/chat/completions, answering
    each request with the next of ``replies``; it keeps the requests it got."""
    app = FastAPI()
    app.state.seen = []

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": "judge-7b", "object": "model"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict:
        body = await request.json()
        app.state.seen.append(body)
        text = replies[(len(app.state.seen) - 1) % len(replies)]
        return {"id": "x", "object": "chat.completion", "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}

    return app


def test_openai_protocol_asks_the_judge_and_reads_its_score() -> None:
    app = judge_app(["Looks right.\nFinal Score: 4", "Final Score: 2.5 (blurry)"])
    images = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    with in_thread(app) as server:
        reward = remote(server.url, protocol="openai", prompt_template="Does it show {prompt}?")
        reward.check()
        got = reward.score(images, ["a red circle", "a cat"])
    assert got.tolist() == pytest.approx([0.8, 0.5], rel=1e-6)  # 4 and 2.5, times the scale 0.2 (float32)
    first = app.state.seen[0]
    assert first["model"] == "judge-7b" and first["temperature"] == 0
    image_part, text_part = first["messages"][0]["content"]
    assert text_part == {"type": "text", "text": "Does it show a red circle?"}
    assert image_part["image_url"]["url"].startswith("data:image/png;base64,")
    sent = decode_image({"encoding": "png", "data": image_part["image_url"]["url"].split(",", 1)[1]}, 0)
    assert torch.equal(sent, png_roundtrip(images[:1])[0])


def test_openai_protocol_refuses_an_unreadable_reply_unless_told_to_score_it_zero() -> None:
    with in_thread(judge_app(["I cannot rate this."])) as server:
        with pytest.raises(RemoteRewardError, match="does not match score_regex"):
            remote(server.url, protocol="openai").score(torch.zeros(1, 3, 4, 4), ["a"])
        lenient = remote(server.url, protocol="openai", on_parse_failure="zero")
        assert lenient.score(torch.zeros(1, 3, 4, 4), ["a"]).tolist() == [0.0]
        with pytest.raises(RewardConfigError, match="not the model 'other'"):
            remote(server.url, protocol="openai", model="other").check()


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def brightness_recipe(reward: dict, steps: int) -> dict:
    data = tiny_recipe(max_steps=steps, eval_every=0)
    data["reward"] = [{"name": "brightness", **reward}]
    return data


def test_a_server_that_goes_away_mid_run_leaves_a_checkpoint_that_resumes_the_same_step(tmp_path: Path) -> None:
    """The server stops during step 3's scoring: the run stops naming it, with a checkpoint of step 2 that
    continues, once a server is back, to the same rewards and weights as a run that was never interrupted."""
    here = train(recipe_from_dict(brightness_recipe({"type": "served:Brightness"}, 3)), tmp_path / "here", quiet=True)
    reward = Brightness(Brightness.Config(stop_after=2))  # two iterations, one request each
    run, port = tmp_path / "remote", free_port()  # the recipe names the address: the same port after the restart
    with reward_in_thread(reward, port=port) as server:
        reward.on_stop = lambda: server.server.__setattr__("should_exit", True)
        settings = {"type": "remote", "url": server.url, "encoding": "float32", **FAST}  # float32: exact
        with pytest.raises(RewardError, match=f"reward server {server.url}/score did not answer") as caught:
            train(recipe_from_dict(brightness_recipe(settings, 3)), run, quiet=True)
        assert "checkpoint" in str(caught.value) and "holds step 2" in str(caught.value)
    assert [r["step"] for r in metrics(run)] == [1, 2]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000002"]
    with reward_in_thread(Brightness(Brightness.Config()), port=port) as server:
        settings = {"type": "remote", "url": server.url, "encoding": "float32", **FAST}
        train(recipe_from_dict(brightness_recipe(settings, 3)), run, resume=run, quiet=True)
    a, b = metrics(here), metrics(run)
    assert [r["step"] for r in b] == [1, 2, 3]
    assert [r["reward/total"] for r in a] == [r["reward/total"] for r in b]  # the same draws, exactly
    assert all(math.isfinite(r["reward/total"]) for r in b)
    wa = load_file(str(here / "checkpoints" / "step_000003" / "weights.safetensors"))
    wb = load_file(str(run / "checkpoints" / "step_000003" / "weights.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)  # no step lost or run twice
