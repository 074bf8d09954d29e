"""The ``edit_judge`` reward against a stand-in OpenAI-style VLM server on 127.0.0.1 (uvicorn in a thread): what it
asks (the rubric's two questions, the source before the result, log-probabilities), how it reads the answers (the
expected value over the judge's alternatives for both tokenizer styles, the written number otherwise), how it
combines them (VIEScore's min and geometric mean), its refusals, its record of the judge, and the same scores when
it is itself served by ``flowrl serve``."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import tiny_recipe
from served import edit_judge_app, in_thread, judge_answer, reward_in_thread

from flowrl.config.condition_checks import reward_condition_problems
from flowrl.config.recipe import recipe_from_dict
from flowrl.core.conditions import Condition, Prompt
from flowrl.rewards.base import RewardConfigError
from flowrl.rewards.edit_judge import EditJudge, quality_question, semantics_question
from flowrl.rewards.http import RemoteRewardError
from flowrl.rewards.judge_logprobs import expected_score
from flowrl.rewards.remote import RemoteReward, server_problems
from flowrl.rewards.wire import decode_image, png_roundtrip

FAST = {"retries": 0, "backoff_s": 0.01, "timeout_s": 10.0}
SC = '{"score": [8, 6], "reasoning": "the hat is there; the background moved a little"}'
PQ = '{"score": [9, 7], "reasoning": "slight smear at the brim"}'


def judge(url: str, **settings: object) -> EditJudge:
    return EditJudge(EditJudge.Config(url=url, **{**FAST, **settings}))  # type: ignore[arg-type]


def edits(count: int = 2) -> tuple[torch.Tensor, list[str]]:
    """Results ``(count, 3, 16, 16)`` and their prompts, each an instruction with its own 24 x 16 RGB source."""
    rng = np.random.default_rng(0)
    prompts = [Prompt(f"add a hat {i}", [Condition(rng.integers(0, 256, (16, 24, 3), dtype=np.uint8))])
               for i in range(count)]
    return torch.rand(count, 3, 16, 16, generator=torch.Generator().manual_seed(1)), prompts


def span(text: str, k: int) -> tuple[int, int]:
    """Where the ``k``-th number of ``text`` is."""
    import re

    return list(re.finditer(r"\d+(?:\.\d+)?", text))[k].span()


# -- reading a number from log-probabilities ---------------------------------------------------------
def test_one_token_numbers_give_the_expected_value_over_the_alternatives() -> None:
    answer = judge_answer(SC, alternatives={0: {"8": 0.6, "7": 0.3, "9": 0.1}})
    assert expected_score(answer, SC, span(SC, 0), 0, 10) == pytest.approx(0.6 * 8 + 0.3 * 7 + 0.1 * 9, rel=1e-12)
    assert expected_score(answer, SC, span(SC, 1), 0, 10) == pytest.approx(6.0, rel=1e-12)  # the token alone
    # an alternative that is not a number is not a score: the others are renormalised
    answer = judge_answer(SC, alternatives={0: {"8": 0.5, "x": 0.3, "6": 0.2}})
    assert expected_score(answer, SC, span(SC, 0), 0, 10) == pytest.approx((0.5 * 8 + 0.2 * 6) / 0.7, rel=1e-12)
    # a number off the scale is no alternative either
    answer = judge_answer(SC, alternatives={0: {"8": 0.5, "12": 0.5}})
    assert expected_score(answer, SC, span(SC, 0), 0, 10) == pytest.approx(8.0, rel=1e-12)


def test_digit_by_digit_numbers_follow_the_written_path_and_read_a_shared_prefix_by_the_written_number() -> None:
    ten = '{"score": [10, 6]}'
    # the judge wrote 1 then 0; at the first digit it thought of 9 too, after the 1 it might have stopped (1)
    answer = judge_answer(ten, digits_apart=True, alternatives={0: {"1": 0.7, "9": 0.3}, 1: {"0": 0.8, ",": 0.2}})
    expected = 0.7 * (0.8 * 10 + 0.2 * 1) + 0.3 * 9
    assert expected_score(answer, ten, span(ten, 0), 0, 10) == pytest.approx(expected, rel=1e-12)
    # written 9 with an alternative 1: the 1 can begin 1 or 10, and stands for 10, the nearer to 9
    nine = '{"score": [9, 6]}'
    answer = judge_answer(nine, digits_apart=True, alternatives={0: {"9": 0.6, "1": 0.4}})
    assert expected_score(answer, nine, span(nine, 0), 0, 10) == pytest.approx(0.6 * 9 + 0.4 * 10, rel=1e-12)
    # written 3 with an alternative 1: it stands for 1
    three = '{"score": [3, 6]}'
    answer = judge_answer(three, digits_apart=True, alternatives={0: {"3": 0.5, "1": 0.5}})
    assert expected_score(answer, three, span(three, 0), 0, 10) == pytest.approx(2.0, rel=1e-12)


def test_a_number_that_cannot_be_placed_is_read_as_written() -> None:
    answer = judge_answer(SC, alternatives={0: {"8": 0.6, "7": 0.4}})
    assert expected_score(answer, SC.replace("hat", "cap"), span(SC, 0), 0, 10) is None  # tokens spell other text
    half = '{"score": [7.5, 6]}'
    assert expected_score(judge_answer(half), half, span(half, 0), 0, 10) is None  # a decimal
    glued = {"choices": [{"logprobs": {"content": [{"token": "[8", "logprob": 0.0, "top_logprobs": []},
                                                   {"token": "]", "logprob": 0.0, "top_logprobs": []}]}}]}
    assert expected_score(glued, "[8]", (1, 2), 0, 10) is None  # the number shares its token with "["
    assert expected_score({"choices": [{}]}, SC, span(SC, 0), 0, 10) is None  # no log-probabilities at all


# -- the reward ----------------------------------------------------------------------------------------------
def test_it_asks_the_rubric_with_the_source_first_and_combines_as_viescore() -> None:
    app = edit_judge_app(lambda body: judge_answer(SC, alternatives={0: {"8": 0.6, "7": 0.4}}),
                         lambda body: judge_answer(PQ))
    images, prompts = edits()
    with in_thread(app) as server:
        reward = judge(server.url)
        reward.check()
        got = reward.score(images, prompts)
    success = (0.6 * 8 + 0.4 * 7) / 10
    semantics, quality = min(success, 0.6), min(0.9, 0.7)
    # float32 scores of float64 sums: a relative 1e-6 covers the rounding
    assert got.tolist() == pytest.approx([math.sqrt(semantics * quality)] * 2, rel=1e-6)
    c = reward.components
    assert c["success"].tolist() == pytest.approx([success] * 2, rel=1e-6)
    assert c["overedit"].tolist() == pytest.approx([0.6] * 2, rel=1e-6)
    assert (c["naturalness"].tolist(), c["artifacts"].tolist()) == (pytest.approx([0.9] * 2), pytest.approx([0.7] * 2))
    assert c["semantics"].tolist() == pytest.approx([semantics] * 2, rel=1e-6)
    assert c["expected"].tolist() == [1.0, 1.0]  # all four sub-scores read from log-probabilities
    asked = {len([p for p in b["messages"][0]["content"] if p["type"] == "image_url"]): b for b in app.state.seen}
    assert sorted(asked) == [1, 2] and len(app.state.seen) == 4  # two questions per image
    sc, pq = asked[2], asked[1]
    assert sc["model"] == "judge-7b" and sc["logprobs"] is True and sc["top_logprobs"] == 20
    source, result, text = sc["messages"][0]["content"]
    instruction = next(str(p) for p in prompts if f"Instruction: {p}" in text["text"])
    assert text["text"] == semantics_question(instruction, 1, 10)
    index = [str(p) for p in prompts].index(instruction)
    sent = decode_image({"encoding": "png", "data": source["image_url"]["url"].split(",", 1)[1]}, 0)
    assert torch.equal(sent, prompts[index].conditions[0].tensor())  # the source's own pixels and size
    sent = decode_image({"encoding": "png", "data": result["image_url"]["url"].split(",", 1)[1]}, 0)
    assert torch.equal(sent, png_roundtrip(images[index : index + 1])[0])
    assert pq["messages"][0]["content"][1]["text"] == quality_question(10)
    assert reward.state_dict() == {"judge": {"url": server.url, "model": "judge-7b", "answered_by": ["judge-7b"]}}


def test_without_log_probabilities_it_reads_the_numbers_as_written() -> None:
    app = edit_judge_app(lambda body: judge_answer(SC, alternatives={0: {"8": 0.6, "7": 0.4}}),
                         lambda body: judge_answer(PQ))
    images, prompts = edits(1)
    with in_thread(app) as server:
        plain = judge(server.url, logprobs=False, score="semantics")
        assert plain.score(images, prompts).tolist() == pytest.approx([0.6], rel=1e-6)  # min(8, 6) / 10
        assert "logprobs" not in app.state.seen[-1] and plain.components["expected"].tolist() == [0.0]
        # a server that ignores the request for log-probabilities: the numbers as written, and the record says so
        bare = edit_judge_app(lambda body: {**judge_answer(SC), "choices": [{"message": {"content": SC}}]},
                              lambda body: judge_answer(PQ))
    with in_thread(bare) as server:
        reward = judge(server.url, score="quality")
        assert reward.score(images, prompts).tolist() == pytest.approx([0.7], rel=1e-6)
        assert reward.components["expected"].tolist() == [0.5]  # the quality answer had them, the other not


def test_an_unreadable_or_off_scale_reply_is_an_error_unless_told_to_score_it_zero() -> None:
    images, prompts = edits(1)
    for reply in ("I cannot judge this.", '{"score": [11, 6]}'):
        app = edit_judge_app(lambda body, r=reply: judge_answer(r), lambda body: judge_answer(PQ))
        with in_thread(app) as server:
            with pytest.raises(RemoteRewardError, match=r'has no "score": \[a, b\] with both in 0..10'):
                judge(server.url, concurrency=1).score(images, prompts)
            lenient = judge(server.url, on_parse_failure="zero")
            assert lenient.score(images, prompts).tolist() == [0.0]  # SC = 0, so O = 0


def test_a_prompt_without_a_source_is_refused_and_check_names_the_server() -> None:
    app = edit_judge_app(lambda body: judge_answer(SC), lambda body: judge_answer(PQ))
    with in_thread(app) as server:
        with pytest.raises(ValueError, match="'add a hat' has none"):
            judge(server.url).score(torch.zeros(1, 3, 8, 8), ["add a hat"])
        with pytest.raises(RewardConfigError, match=r"serves judge-7b, not the model 'other' \(reward.model\)"):
            judge(server.url, model="other").check()
        url = server.url
    with pytest.raises(RewardConfigError, match=f"{url}/v1/models did not answer .*start the judge's server"):
        judge(url).check()
    with pytest.raises(RewardConfigError, match="reward.url no server address"):
        judge("").check()
    assert EditJudge.needs_conditions(EditJudge.Config())


def test_a_resumed_run_keeps_the_record_of_every_judge() -> None:
    app = edit_judge_app(lambda body: judge_answer(SC, model="judge-7b-v2"), lambda body: judge_answer(PQ),
                         models=("judge-7b-v2",))
    images, prompts = edits(1)
    with in_thread(app) as server:
        reward = judge(server.url)
        reward.load_state_dict({"judge": {"url": server.url, "model": "judge-7b", "answered_by": ["judge-7b"]}})
        reward.score(images, prompts)  # no check() first: it asks /v1/models itself
    assert reward.state_dict()["judge"] == {"url": server.url, "model": "judge-7b-v2",
                                            "answered_by": ["judge-7b", "judge-7b-v2"]}


def test_served_by_flowrl_serve_it_scores_as_in_process() -> None:
    """`flowrl serve edit_judge` in front of the judge: the trainer's remote reward sends the sources
    (flowrl-reward/2) and gets the same scores and components."""
    app = edit_judge_app(lambda body: judge_answer(SC, digits_apart=True, alternatives={0: {"8": 0.5, "9": 0.5}}),
                         lambda body: judge_answer(PQ, digits_apart=True, alternatives={1: {"7": 0.9, "1": 0.1}}))
    images, prompts = edits(3)
    with in_thread(app) as vlm:
        here = judge(vlm.url)
        expected = here.score(png_roundtrip(images), prompts)
        with reward_in_thread(judge(vlm.url), "edit_judge", max_body_bytes=1 << 24) as served:
            remote = RemoteReward(RemoteReward.Config(url=served.url, conditions=True, expect="edit_judge", **FAST))
            remote.check()
            got = remote.score(images, prompts)
            assert remote.health["needs_conditions"] is True
    assert torch.equal(got, expected)  # the same judge answers on the same PNG pixels
    assert torch.equal(remote.components["expected"], here.components["expected"])
    # PQ: artifacts 7 with an alternative 1, which can begin 1 or 10 and stands for 10 (nearer the written 7)
    assert here.components["artifacts"].tolist() == pytest.approx([(0.9 * 7 + 0.1 * 10) / 10] * 3, rel=1e-6)


def test_validate_refuses_it_on_text_prompts_and_asks_its_server() -> None:
    data = tiny_recipe()
    data["reward"] = [{"type": "edit_judge", "url": "http://127.0.0.1:1", "retries": 0}]
    recipe = recipe_from_dict(data)
    ((key, message),) = reward_condition_problems(recipe)
    assert key == "reward" and message.startswith("'edit_judge' needs each prompt's condition images")
    ((key, message),) = server_problems(recipe)  # `flowrl validate` asks the judge's server, as a remote reward's
    assert key == "reward.url" and "http://127.0.0.1:1/v1/models did not answer" in message
