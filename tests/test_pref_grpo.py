"""Pref-GRPO (arXiv 2508.20751): group-wise rewards (flowrl.core.group_rewards), the win rate of
``pairwise_win_rate`` over every pair of a group, the world verifier judge, the group-wise reward next to pointwise
ones (weights, schedules, every multi_reward form), validate's refusals, and a short run of recipes/pref_grpo.toml.
The OpenAI-style judge against a loopback server is in tests/test_pairwise_judge.py."""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
import tomllib
from pathlib import Path

import attrs
import pytest
import torch
from conftest import ROOT
from torch import Tensor

import flowrl
from flowrl import RecipeError
from flowrl.config.recipe import load_recipe, recipe_from_dict
from flowrl.conformance import check_judge, check_reward
from flowrl.core.group_rewards import GroupReward
from flowrl.core.interfaces import RewardError
from flowrl.core.judges import PairwiseJudge
from flowrl.core.types import Conditioning, Rollout, Transitions
from flowrl.parts.advantages import GroupNorm, batch_whiten, group_normalize
from flowrl.rewards.built import BuiltReward
from flowrl.rewards.frames import score_pictures
from flowrl.rewards.win_rate import PairwiseWinRate, win_rates
from flowrl.trainer import train
from flowrl.trainer.rewards import RewardPhase, score_rollout
from flowrl.world.components import WorldVerifier
from flowrl.world.grammar import enumerate_scenes
from flowrl.world.render import render_batch

SCENES = enumerate_scenes("train")[:400:100]


class Brighter(PairwiseJudge):
    """A judge with known verdicts: the brighter image wins; means within ``margin`` tie."""

    @attrs.frozen
    class Config:
        margin: float = 0.0

    def compare(self, first: Tensor, second: Tensor, prompts: list[str]) -> Tensor:
        d = first.double().mean((1, 2, 3)) - second.double().mean((1, 2, 3))
        return torch.where(d > self.config.margin, 1.0, torch.where(d < -self.config.margin, 0.0, 0.5)).float()


class FirstWins(PairwiseJudge):
    """A judge with nothing but a position bias: the first image always wins."""

    @attrs.frozen
    class Config:
        pass

    def compare(self, first: Tensor, second: Tensor, prompts: list[str]) -> Tensor:
        return torch.ones(first.shape[0])


def win_rate(judge: PairwiseJudge, both_orders: bool = False) -> PairwiseWinRate:
    reward = PairwiseWinRate(PairwiseWinRate.Config(judge={"type": "world_verifier"}, both_orders=both_orders))
    reward.judge = judge  # a judge of this file's own (not registered)
    return reward


def rendered() -> Tensor:
    return torch.from_numpy(render_batch(SCENES, 0)).permute(0, 3, 1, 2).float() / 255


def reference_rates(values: list[float]) -> list[float]:
    """(wins + ties / 2) / (G - 1) by counting, over every ordered pair: the definition, written apart."""
    g = len(values)
    return [sum(1.0 if a > b else 0.5 if a == b else 0.0 for j, b in enumerate(values) if j != i) / (g - 1)
            for i, a in enumerate(values)]


# -- the win rate ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [2, 3, 5, 8, 9, 17])
def test_win_rates_share_out_half_a_point_per_image(size: int) -> None:
    """``sum_i w_i = G / 2``: the ``G (G - 1) / 2`` pairs give out one point each. Exact in float64 where ``G - 1``
    is a power of two (the division is exact); otherwise each ``w_i`` is rounded once (relative 2^-53), so the sum
    of ``G <= 17`` values of at most 1 is within ``17 * 2^-53 < 2e-15`` of ``G / 2``."""
    means = torch.rand(size, generator=torch.Generator().manual_seed(size))
    images = means.reshape(size, 1, 1, 1).expand(size, 3, 4, 4).clone()
    images[: size // 3] = images[size // 3]  # ties too
    for both in (False, True):
        scores = win_rate(Brighter(Brighter.Config()), both).score_group(images, "p")
        assert scores.shape == (size,) and scores.dtype == torch.float32
        first, second = (torch.tensor(x) for x in zip(*itertools.combinations(range(size), 2), strict=True))
        exact = win_rates(first, second, Brighter(Brighter.Config()).compare(images[first], images[second],
                                                                                ["p"] * len(first)), size)
        if (size - 1) & (size - 2) == 0:
            assert float(exact.sum()) == size / 2
        else:
            assert abs(float(exact.sum()) - size / 2) < 2e-15
        assert torch.equal(scores, exact.float())
        assert scores.tolist() == pytest.approx(reference_rates(images.mean((1, 2, 3)).tolist()), abs=1e-7)


def test_ties_and_the_smallest_groups() -> None:
    judge = Brighter(Brighter.Config(margin=0.1))
    reward = win_rate(judge)
    dark, grey, light = (torch.full((1, 3, 4, 4), v) for v in (0.2, 0.25, 0.9))
    assert reward.score_group(torch.cat([light, dark]), "p").tolist() == [1.0, 0.0]  # G = 2: the winner gets 1
    assert reward.score_group(torch.cat([dark, grey]), "p").tolist() == [0.5, 0.5]  # within the margin: a tie
    # dark and grey tie, both lose to light: (0 + 0.5) / 2 each, light (1 + 1) / 2
    assert reward.score_group(torch.cat([dark, light, grey]), "p").tolist() == [0.25, 1.0, 0.25]
    assert reward.score_group(light, "p").tolist() == [0.5]  # a group of one: nothing to compare with
    assert reward.score_group(torch.cat([grey] * 4), "p").tolist() == [0.5] * 4


def test_both_orders_cancels_a_position_bias() -> None:
    """A judge that always prefers the first image ranks a group by place alone with one order per pair
    (image i wins against every later one: (G - 1 - i) / (G - 1)); asked both ways every pair ties. A judge
    without a bias gives the same rates either way."""
    images = torch.rand(5, 3, 4, 4, generator=torch.Generator().manual_seed(3))
    assert win_rate(FirstWins(FirstWins.Config())).score_group(images, "p").tolist() == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert win_rate(FirstWins(FirstWins.Config()), True).score_group(images, "p").tolist() == [0.5] * 5
    fair = Brighter(Brighter.Config())
    assert torch.equal(win_rate(fair).score_group(images, "p"), win_rate(fair, True).score_group(images, "p"))


def test_the_world_judge_prefers_the_higher_verifier_score() -> None:
    images = torch.cat([rendered()[:1], torch.zeros(1, 3, 32, 32), rendered()[:1] * 0.5])
    prompt = SCENES[0].text
    scores = WorldVerifier(WorldVerifier.Config()).score(images, [prompt] * 3).tolist()
    assert scores[0] > scores[1]  # the scene rendered for its prompt beats a blank image: not a vacuous check
    reward = flowrl.build("reward", {"type": "pairwise_win_rate", "judge": {"type": "world_verifier"}})
    assert reward.score_group(images, prompt).tolist() == pytest.approx(reference_rates(scores), abs=1e-7)
    wide = flowrl.build("reward", {"type": "pairwise_win_rate", "judge": {"type": "world_verifier", "margin": 1.0}})
    assert wide.score_group(images, prompt).tolist() == [0.5] * 3  # every score difference within the margin


def test_a_judge_that_breaks_its_contract_is_named() -> None:
    class Loud(FirstWins):
        def compare(self, first: Tensor, second: Tensor, prompts: list[str]) -> Tensor:
            return torch.full((first.shape[0],), 2.0)

    with pytest.raises(ValueError, match=r"verdicts outside \[0, 1\]"):
        win_rate(Loud(Loud.Config())).score_group(torch.rand(3, 3, 4, 4), "p")


# -- conformance ----------------------------------------------------------------------------------------------
def test_the_win_rate_conforms_with_groups_of_several_images() -> None:
    """The conformance rules with repeated prompts: scoring the batch equals scoring each prompt's images alone
    (the registry-wide test in test_conformance_models.py gives each image its own prompt)."""
    images = torch.cat([rendered(), torch.rand(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))])
    prompts = [s.text for s in SCENES] * 2  # each prompt twice: a rendering and noise
    reward = flowrl.build("reward", {"type": "pairwise_win_rate", "judge": {"type": "world_verifier"}})
    scores = check_reward(reward, images, prompts, bounds=(0.0, 1.0))
    assert scores[:4].tolist() == [1.0] * 4 and scores[4:].tolist() == [0.0] * 4  # each rendering beats its noise


def test_every_registered_judge_that_runs_locally_conforms() -> None:
    """The world verifier judge here; the OpenAI-style judge against a loopback server (test_pairwise_judge.py)."""
    assert set(flowrl.available("judge")) == {"world_verifier", "openai"}
    first = rendered()
    second = torch.cat([first[1:2], torch.rand(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))])
    verdicts = check_judge(flowrl.build("judge", {"type": "world_verifier"}), first, second, [s.text for s in SCENES])
    assert verdicts.tolist()[1:] == [1.0, 1.0, 1.0]


# -- the reward phase: groups, composition with pointwise rewards ---------------------------------------------
def rollout(groups: list[int], prompt_rows: list[int], images: Tensor) -> Rollout:
    r = len(groups)
    transitions = Transitions(
        inputs=torch.zeros(1, 2), input_s=torch.ones(1), input_cond=torch.zeros(1, dtype=torch.long),
        input_index=torch.zeros(r, dtype=torch.long), s_next=torch.zeros(r), x_next=torch.zeros(r, 2),
        log_prob=torch.zeros(r), rollout_index=torch.arange(r), unit_index=torch.zeros(r, dtype=torch.long),
        weight=torch.ones(r),
    )
    return Rollout(prompts=[s.text for s in SCENES], cond=Conditioning({"e": torch.zeros(len(SCENES), 1)}),
                   images=images, rollout_prompt=torch.tensor(prompt_rows), group=torch.tensor(groups),
                   transitions=transitions, nfe=0)


def test_the_reward_phase_judges_each_rollout_group_not_each_prompt() -> None:
    """Two groups of the same prompt (a (prompt, unit) pair each, as the shared-anchor sampler makes) are judged
    apart: each group's win rates sum to half its size, whatever the other group holds."""
    images = torch.cat([rendered()[:1], torch.zeros(1, 3, 32, 32), rendered()[:1], rendered()[:1] * 0.3])
    reward = flowrl.build("reward", {"type": "pairwise_win_rate", "judge": {"type": "world_verifier"}})
    batch = score_rollout([BuiltReward("pair", 1.0, reward)], rollout([0, 0, 1, 1], [0, 0, 0, 0], images))
    alone = torch.cat([reward.score_group(images[:2], SCENES[0].text), reward.score_group(images[2:], SCENES[0].text)])
    assert torch.equal(batch.scores["pair"], alone)
    assert batch.scores["pair"][:2].sum() == 1.0 and batch.scores["pair"][2:].sum() == 1.0
    merged = reward.score(images, [SCENES[0].text] * 4)  # by prompt alone the four would be one group
    assert not torch.equal(merged, batch.scores["pair"])


def test_a_group_of_two_prompts_is_an_error_naming_the_reward() -> None:
    reward = flowrl.build("reward", {"type": "pairwise_win_rate", "judge": {"type": "world_verifier"}})
    with pytest.raises(RewardError, match="reward 'pair'.*different prompts"):
        score_rollout([BuiltReward("pair", 1.0, reward)], rollout([0, 0], [0, 1], rendered()[:2]))


@pytest.mark.parametrize("mode", ["sum_then_normalize", "normalize_then_sum", "gdpo"])
def test_a_group_wise_reward_composes_with_a_pointwise_one(mode: str) -> None:
    """The win rate and the verifier in one recipe: RewardPhase scores both (a scheduled weight at its step), and
    every multi_reward form combines them as any two rewards (the formulas written out here)."""
    recipe = load_recipe(ROOT / "recipes" / "pref_grpo.toml", [
        f"advantage.multi_reward=\"{mode}\"",
    ])
    data = recipe.to_dict()
    data["reward"][1]["weight"] = {"schedule": "linear", "start": 0.0, "end": 1.0, "steps": 10}
    phase = RewardPhase(recipe_from_dict(data))
    images = torch.cat([rendered(), torch.rand(4, 3, 32, 32, generator=torch.Generator().manual_seed(2))])
    groups, rows = [0, 1, 2, 3, 0, 1, 2, 3], [0, 1, 2, 3, 0, 1, 2, 3]
    roll = rollout(groups, rows, images)

    class Plain(flowrl.RolloutSampler):
        @attrs.frozen
        class Config:
            pass

        def rollout(self, *args: object) -> Rollout:
            raise NotImplementedError

    batch = phase(roll, Plain(Plain.Config()), step=5)
    assert batch.weights == {"pairwise": 1.0, "verifier": 0.5}
    pair, verifier = batch.scores["pairwise"], batch.scores["verifier"]
    assert pair.tolist() == [1.0] * 4 + [0.0] * 4  # each rendering beats the noise of its group
    assert torch.equal(verifier, WorldVerifier(WorldVerifier.Config()).score(images, roll.rollout_texts()))
    estimator = GroupNorm(attrs.evolve(recipe.parts["advantage"].config))
    got = estimator(batch, roll)
    g, c = roll.group, estimator.config
    norm = [group_normalize(s, g, eps=c.eps, unbiased=c.unbiased, clip=None) for s in (pair, verifier)]
    if mode == "sum_then_normalize":
        want = group_normalize(pair + 0.5 * verifier, g, eps=c.eps, unbiased=c.unbiased, clip=c.clip)
    else:
        summed = norm[0] + 0.5 * norm[1]
        want = (batch_whiten(summed, eps=c.eps, unbiased=c.unbiased) if mode == "gdpo" else summed).clamp(-5, 5)
    assert torch.allclose(got.values, want, rtol=1e-6, atol=1e-7)  # float32 scores: rounding of the same sums
    assert set(got.per_reward) == {"pairwise", "verifier"}


def test_clips_are_judged_frame_by_frame_within_their_group() -> None:
    """A clip's score from an image reward is the mean over its frames; for a group-wise reward frame f of a group's
    clips is judged as a group of its own."""
    frames = torch.stack([torch.full((2, 3, 4, 4), v) for v in (0.9, 0.1, 0.5)])  # 3 clips of 2 frames
    frames[2, 1] = 1.0  # the third clip's second frame is the brightest
    reward = win_rate(Brighter(Brighter.Config()))
    reward.frames = "all"
    got = score_pictures(reward, frames, ["p"] * 3, torch.tensor([4, 4, 4]))
    per_frame = [reward.score_group(frames[:, f], "p") for f in range(2)]
    assert torch.equal(got, (per_frame[0] + per_frame[1]) / 2)
    assert got.tolist() == pytest.approx([0.75, 0.0, 0.75])  # first: 1 then 0.5; third: 0.5 then 1


# -- validate ------------------------------------------------------------------------------------------------
def refusal(overrides: list[str], recipe: str = "pref_grpo.toml") -> list[tuple[str, str]]:
    with pytest.raises(RecipeError) as caught:
        load_recipe(ROOT / "recipes" / recipe, overrides)
    return caught.value.problems


def test_validate_refuses_a_group_wise_reward_where_groups_are_not_the_normalised_sets() -> None:
    """E-GRPO's multi-granularity rollouts: one line naming the reward and the sampler, the only problem."""
    data = tomllib.loads((ROOT / "recipes" / "egrpo_granular.toml").read_text())
    data["reward"] = [data["reward"], {"type": "pairwise_win_rate", "judge": {"type": "world_verifier"}}] \
        if isinstance(data["reward"], dict) else [*data["reward"], {"type": "pairwise_win_rate",
                                                                     "judge": {"type": "world_verifier"}}]
    with pytest.raises(RecipeError) as caught:
        recipe_from_dict(data)
    problems = caught.value.problems
    found = [m for k, m in problems if k == "reward[1]"]
    assert len(problems) == 1 and len(found) == 1 and "\n" not in found[0]
    assert found[0].startswith("reward[1] 'pairwise_win_rate' cannot take rollouts finishing every jump at several")
    assert "sampler 'egrpo_granular'" in found[0]
    recipe_from_dict({**data, "reward": data["reward"][:1]})  # the same recipe without it loads


@pytest.mark.parametrize(("override", "key", "says"), [
    ("reward.judge.margin=-1", "reward[0].judge", "judge.margin: must be >= 0 (got -1.0)"),
    ("reward.judge.type=\"world_verifer\"", "reward[0].judge", "did you mean 'world_verifier'"),
    ("reward.judge={}", "reward[0].judge", "missing 'type'"),
])
def test_a_bad_judge_table_is_one_line_naming_the_key(override: str, key: str, says: str) -> None:
    problems = refusal([override])
    assert [k for k, _ in problems] == [key] and says in problems[0][1] and "\n" not in problems[0][1]


def test_validate_exits_2_with_one_line_without_a_judge_table(tmp_path: Path) -> None:
    text = (ROOT / "recipes" / "pref_grpo.toml").read_text().replace("[reward.judge]\ntype = \"world_verifier\"\n"
                                                                     "margin = 0.0\n", "")
    path = tmp_path / "recipe.toml"
    path.write_text(text)
    out = subprocess.run([sys.executable, "-m", "flowrl.cli.main", "validate", str(path)], capture_output=True,
                         text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 2
    lines = [line for line in (out.stdout + out.stderr).splitlines() if line.startswith("  [")]
    # without a table the judge is the default, a served VLM, whose address the recipe must give
    assert len(lines) == 1 and lines[0].startswith("  [reward[0].judge.url] no server address: set url"), lines


# -- the world recipe ----------------------------------------------------------------------------------------
def test_the_world_recipe_trains(tmp_path: Path) -> None:
    """Three iterations of recipes/pref_grpo.toml (2 prompts an iteration): the win rate's batch mean is 1/2 at
    every step by construction, the watched verifier is logged, the groups have spread and the weights move."""
    small = ["trainer.max_steps=3", "trainer.prompts_per_step=2", "trainer.eval_every=0", "trainer.image_every=0",
             "trainer.checkpoint_every=0", "trainer.max_minutes=0", "trainer.keep_best=\"\""]
    recipe = load_recipe(ROOT / "recipes" / "pref_grpo.toml", small)
    out = train(recipe, tmp_path / "run", quiet=True)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for row in rows:
        assert abs(row["reward/pairwise"] - 0.5) < 1e-6  # float32 mean of 16 rates summing to 8 exactly-ish
        assert 0.0 <= row["reward/verifier"] <= 1.0 and row["reward/total"] == row["reward/pairwise"]
        assert row["advantage/abs_mean"] > 0 and math.isfinite(row["loss"]) and row["grad_norm"] > 0
        assert row["skipped_steps"] == 0


def test_a_group_wise_reward_is_not_served() -> None:
    """A served reward gets chunks of images (the client's batch_size), which could split a group."""
    from flowrl.cli.serve import build_reward
    from flowrl.core.convert import ConfigError

    with pytest.raises(ConfigError, match="'pairwise_win_rate' is a group-wise reward, .* cannot be served"):
        build_reward("pairwise_win_rate", ["judge={type=\"world_verifier\"}"])
    assert not isinstance(build_reward("world_verifier", []), GroupReward)  # a pointwise reward still serves
