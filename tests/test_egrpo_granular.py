"""E-GRPO's multi-granularity advantages: what they normalise over (properties of the estimator on synthetic
batches), the sampler that finishes every jump on several ODE grids, and the recipe that trains with both."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import shipped_tiny
from flowrl_zoo.egrpo import multi_granular, stride_grid
from hypothesis import given, settings
from hypothesis import strategies as st

import flowrl
from flowrl.config.recipe import RecipeError, recipe_from_dict
from flowrl.core.extras import PerRollout, RolloutIds
from flowrl.core.rng import RolloutRNG
from flowrl.core.types import Conditioning, Plan, RewardBatch, Rollout, Schedule, Unit
from flowrl.parts.advantages import group_normalize
from flowrl.parts.samplers.solvers import euler
from flowrl.trainer import train

FAST = settings(max_examples=60, deadline=None)


@st.composite
def batches(draw: st.DrawFn, max_k: int = 3) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rewards, group, level, branch): ``n_groups`` groups of ``G`` jumps, each seen at ``K`` granularities,
    in a shuffled order (images of one jump are not adjacent, as in the sampler's layout)."""
    groups, g, k = draw(st.integers(1, 4)), draw(st.integers(2, 5)), draw(st.integers(1, max_k))
    jumps = groups * g
    branch = torch.arange(jumps).repeat(k)
    group = (branch // g).clone()
    level = torch.arange(k).repeat_interleave(jumps)
    # rewards on a grid of 1/4 in [-10, 10]: ties (constant sets) are common, and a spread is never so small that
    # a shift rounds it away (a spread of 1e-38 shifted by 1 is a constant set: not a property of the estimator)
    values = draw(st.lists(st.integers(-40, 40), min_size=jumps * k, max_size=jumps * k))
    order = torch.randperm(jumps * k, generator=torch.Generator().manual_seed(draw(st.integers(0, 10**6))))
    rewards = torch.tensor(values, dtype=torch.float64) / 4
    return rewards[order], group[order], level[order], branch[order]


@FAST
@given(batches(), st.data())
def test_each_granularity_of_each_group_is_normalised_on_its_own(batch: tuple, data: st.DataObject) -> None:
    """Shifting and scaling (by a positive factor) the rewards of one (group, granularity) set leaves every
    advantage unchanged: that set is what a reward is compared against (eps = 0: exactly scale-free)."""
    rewards, group, level, branch = batch
    base = multi_granular(rewards, group, level, branch, eps=0.0, clip=None)
    a = data.draw(st.floats(0.1, 10.0))
    b = data.draw(st.floats(-5.0, 5.0))
    g, k = int(group[0]), int(level[0])
    moved = torch.where((group == g) & (level == k), a * rewards + b, rewards)
    # float64 normalisation of rewards up to 10 scaled by up to 10: rounding below 1e-9 of the unit-scale values
    torch.testing.assert_close(multi_granular(moved, group, level, branch, eps=0.0, clip=None), base,
                               rtol=1e-9, atol=1e-9)


@FAST
@given(batches())
def test_constant_sets_give_zero_and_a_jump_shares_one_value(batch: tuple) -> None:
    rewards, group, level, branch = batch
    values = multi_granular(rewards, group, level, branch, clip=None)
    for b in torch.unique(branch):
        assert torch.unique(values[branch == b]).numel() == 1  # every image of a jump trains it the same way
    flat = torch.zeros_like(rewards) + 0.25 * level  # constant within every (group, granularity)
    assert torch.equal(multi_granular(flat, group, level, branch), torch.zeros_like(rewards))


@FAST
@given(batches(max_k=1), st.booleans())
def test_one_granularity_is_the_per_unit_form(batch: tuple, unbiased: bool) -> None:
    """K = 1: exactly group_norm within (prompt, unit), clip included."""
    rewards, group, level, branch = batch
    values = multi_granular(rewards, group, level, branch, unbiased=unbiased, clip=1.5)
    assert torch.equal(values, group_normalize(rewards, group, unbiased=unbiased, clip=1.5))


@FAST
@given(batches(max_k=1), st.integers(2, 4))
def test_equal_granularities_add_up_and_mean_averages(batch: tuple, k: int) -> None:
    """When every granularity gives a jump the same reward, the sum is K times the per-unit advantage and the
    mean is the per-unit advantage."""
    rewards, group, _, branch = batch
    many = (rewards.repeat(k), group.repeat(k), torch.arange(k).repeat_interleave(len(rewards)), branch.repeat(k))
    single = group_normalize(rewards, group, clip=None).repeat(k)
    torch.testing.assert_close(multi_granular(*many, clip=None), k * single, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(multi_granular(*many, clip=None, combine="mean"), single, rtol=1e-12, atol=1e-12)


@FAST
@given(batches())
def test_sums_vanish_per_group_and_the_order_does_not_matter(batch: tuple) -> None:
    rewards, group, level, branch = batch
    values = multi_granular(rewards, group, level, branch, clip=None)
    k = int(level.max()) + 1
    for g in torch.unique(group):
        firsts = (group == g) & (level == 0)  # one image per jump of the group
        assert abs(float(values[firsts].sum())) < 1e-9 * k * max(1, int(firsts.sum()))
    perm = torch.randperm(len(rewards), generator=torch.Generator().manual_seed(1))
    again = multi_granular(rewards[perm], group[perm], level[perm], branch[perm], clip=None)
    # the same float64 sums in another order: rounding of unit-scale values, far below 1e-12
    torch.testing.assert_close(again, values[perm], rtol=1e-12, atol=1e-12)


@FAST
@given(batches(max_k=2))
def test_two_granularities_never_anticorrelate_with_an_image_reward(batch: tuple) -> None:
    """With K = 2 the summed advantage never points against the images' rewards within a group (the
    conformance rule); the covariance is ``(a - b)(s1 a - s2 b) >= 0`` per group, a, b the normalised norms."""
    rewards, group, level, branch = batch
    values = multi_granular(rewards, group, level, branch, clip=None)
    for g in torch.unique(group):
        members = group == g
        centred = rewards[members] - rewards[members].mean()
        assert float((values[members] * centred).sum()) >= -1e-9


def test_a_jump_missing_a_granularity_is_refused() -> None:
    with pytest.raises(ValueError, match="one image per granularity"):
        multi_granular(torch.zeros(3), torch.zeros(3, dtype=torch.long), torch.tensor([0, 1, 0]),
                       torch.tensor([0, 0, 1]))


# -- the estimator as a part ---------------------------------------------------------------------------------------
def synthetic(rewards: torch.Tensor, group: torch.Tensor, level: torch.Tensor, branch: torch.Tensor) -> Rollout:
    r = len(rewards)
    return Rollout(
        prompts=["p"], cond=Conditioning({"x": torch.zeros(1, 1)}), images=torch.zeros(r, 3, 2, 2),
        rollout_prompt=torch.zeros(r, dtype=torch.long), group=group, transitions=None,  # type: ignore[arg-type]
        nfe=0, extras={"granularity": PerRollout(level), "branch": RolloutIds(branch)},
    )


@pytest.mark.parametrize("mode", ["sum_then_normalize", "normalize_then_sum"])
def test_the_estimator_applies_it_to_every_reward(mode: str) -> None:
    gen = torch.Generator().manual_seed(0)
    group = torch.tensor([0, 0, 0, 1, 1, 1]).repeat(2)
    level, branch = torch.arange(2).repeat_interleave(6), torch.arange(6).repeat(2)
    a, b = torch.randn(12, generator=gen), torch.randn(12, generator=gen)
    estimator = flowrl.build("advantage", {"type": "egrpo_granular", "multi_reward": mode, "clip": 100.0})
    out = estimator(RewardBatch({"a": a, "b": b}, {"a": 1.0, "b": 0.5}), synthetic(a, group, level, branch))
    each = {name: multi_granular(v, group, level, branch, clip=None) for name, v in (("a", a), ("b", b))}
    expected = multi_granular(a + 0.5 * b, group, level, branch, clip=100.0) if mode == "sum_then_normalize" \
        else each["a"] + 0.5 * each["b"]
    assert torch.equal(out.values, expected)
    assert all(torch.equal(out.per_reward[k], each[k]) for k in each)


# -- the sampler ---------------------------------------------------------------------------------------------------
def test_stride_grids_end_at_zero() -> None:
    assert stride_grid(8, 3, 1) == [3, 4, 5, 6, 7, 8]
    assert stride_grid(8, 3, 2) == [3, 5, 7, 8]
    assert stride_grid(8, 2, 3) == [2, 5, 8]
    assert stride_grid(8, 8, 2) == [8]


def rollouts(granularities: list[int] | None) -> tuple[Rollout, Schedule, Plan, object]:
    backbone = flowrl.build("backbone", {"type": "tiny_flux", "resolution": 16})
    schedule = Schedule(backbone.schedule_sigmas(8, 3.0), flowrl.build("kernel", {"type": "flow_grpo_sde"}))
    plan = Plan(units=(Unit(0, 1), Unit(1, 2)), trained=(0, 1))
    spec = {"type": "anchor_branch", "group_size": 3} if granularities is None else \
        {"type": "egrpo_granular", "group_size": 3, "granularities": granularities}
    with torch.no_grad():
        out = flowrl.build("sampler", spec).rollout(backbone, ["a", "b"], plan, schedule, RolloutRNG(0, 0, [0, 1]))
    return out, schedule, plan, backbone


def test_the_first_granularity_is_the_per_unit_sampler_and_the_others_cost_their_intervals() -> None:
    plain, _, plan, _ = rollouts(None)
    one, _, _, _ = rollouts([1])
    two, schedule, _, backbone = rollouts([1, 2])
    r = plain.num_rollouts  # 2 prompts x 2 units x 3 jumps
    assert torch.equal(one.images, plain.images) and one.nfe == plain.nfe
    assert two.num_rollouts == 2 * r and torch.equal(two.images[:r], plain.images)
    assert torch.equal(two.transitions.x_next, plain.transitions.x_next)  # the same jumps, recorded once
    assert torch.equal(two.transitions.rollout_index, torch.arange(r))
    coarse = sum(3 * 2 * math.ceil((8 - u.end) / 2) for u in plan.units)  # jumps x prompts x stride-2 intervals
    assert two.nfe == plain.nfe + coarse
    assert torch.equal(two.group, plain.group.repeat(2))
    assert torch.equal(two.extras["branch"].value, torch.arange(r).repeat(2))  # type: ignore[attr-defined]
    # the coarse copy of jump j: Euler over every second grid point from the jump's end, by hand
    t = plain.transitions
    j = r - 1
    end = plan.units[int(t.unit_index[j])].end
    sig = schedule.tensor()[torch.tensor(stride_grid(8, end, 2))]
    cond = plain.cond.take(plain.rollout_prompt[j : j + 1])
    with torch.no_grad():
        x = euler(lambda z, s: backbone.velocity(z, s.expand(1), cond), t.x_next[j : j + 1], sig)  # type: ignore[attr-defined]
        by_hand = backbone.decode(x)  # type: ignore[attr-defined]
    # one row against a batch of 6 rows through the same tiny transformer: float32 rounding only
    torch.testing.assert_close(two.images[r + j : r + j + 1], by_hand, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(two.images[r + j], two.images[j], atol=1e-3)  # a coarser tail, another image


def test_a_per_image_estimator_is_refused_with_the_granular_sampler() -> None:
    data = shipped_tiny("egrpo_granular").to_dict()
    data["advantage"] = {"type": "group_norm"}
    with pytest.raises(RecipeError, match="sampler 'egrpo_granular' needs advantages that sum each jump"):
        recipe_from_dict(data)
    data["advantage"] = {"type": "egrpo_granular"}
    data["sampler"] = {"type": "anchor_branch", "group_size": 2}
    with pytest.raises(RecipeError, match="advantage 'egrpo_granular' needs rollouts finishing every jump"):
        recipe_from_dict(data)


def test_the_recipe_trains_two_iterations(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    recipe = shipped_tiny("egrpo_granular", ["sampler.group_size=2"])
    run = train(recipe, tmp_path / "run", quiet=True)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2]
    assert all(math.isfinite(row["loss"]) and row["grad_norm"] > 0 for row in rows), rows
    assert rows[0]["advantage/abs_mean"] > 0
