"""GDPO multi-reward aggregation (``[advantage] multi_reward = "gdpo"``): each reward normalised within its group,
the weighted sum whitened over the whole batch, then clipped once (docs/algorithms.md, GDPO)."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_recipe
from hypothesis import given, settings
from hypothesis import strategies as st
from test_advantages import _rollout, grouped

from flowrl import RecipeError
from flowrl.config.recipe import recipe_from_dict
from flowrl.core.types import RewardBatch
from flowrl.parts.advantages import GroupNorm, batch_whiten

FAST = settings(max_examples=60, deadline=None)


def gdpo(**kw: object) -> GroupNorm:
    return GroupNorm(GroupNorm.Config(multi_reward="gdpo", **kw))  # type: ignore[arg-type]


@st.composite
def two_rewards(draw):
    """Two rewards on a 0.25 grid over the same groups, and positive weights."""
    r, g = draw(grouped())
    ints = draw(st.lists(st.integers(-20, 20), min_size=len(g), max_size=len(g)))
    weights = draw(st.tuples(st.sampled_from([0.25, 0.5, 1.0, 2.0, 3.0]), st.sampled_from([0.25, 1.0, 1.5, 4.0])))
    return r, torch.tensor(ints, dtype=torch.float64) / 4, g, weights


@FAST
@given(two_rewards(), st.booleans(), st.booleans())
def test_the_sum_is_whitened_over_the_batch(data, unbiased, global_std) -> None:
    """Before clipping: batch mean 0 and batch std 1 (with eps 0; the std as ``unbiased`` says), or exact zeros
    where the weighted sum of the group-normalised rewards is constant over the batch."""
    x, y, g, (wx, wy) = data
    batch = RewardBatch(scores={"x": x, "y": y}, weights={"x": wx, "y": wy})
    values = gdpo(eps=0.0, clip=None, unbiased=unbiased, global_std=global_std)(batch, _rollout(g.tolist())).values
    summed = GroupNorm(GroupNorm.Config(eps=0.0, clip=None, unbiased=unbiased, global_std=global_std,
                                        multi_reward="normalize_then_sum"))(batch, _rollout(g.tolist())).values
    assert values.dtype == torch.float64 and torch.isfinite(values).all()
    if bool(summed.min() == summed.max()):
        assert torch.equal(values, torch.zeros_like(values))
        return
    assert abs(float(values.mean())) < 1e-9
    assert float(values.std(unbiased=unbiased)) == pytest.approx(1.0, abs=1e-9)


@FAST
@given(two_rewards(), st.sampled_from([0.25, 0.5, 3.0, 8.0]), st.integers(-40, 40), st.booleans())
def test_a_positive_affine_change_of_one_reward_changes_nothing(data, scale, shift, which) -> None:
    """Each reward is normalised within its group first, so ``a r + b`` (a > 0) of either reward gives the same
    advantages. With eps 0 the group z-score is exactly scale-free; the tolerance is float64 rounding (the grid
    keeps every non-constant group's std >= 0.08, so nothing near 0/0 amplifies it)."""
    x, y, g, (wx, wy) = data
    rollout = _rollout(g.tolist())
    est = gdpo(eps=0.0)  # clipped at the default 5, as a run uses it: the clip is applied to equal values
    before = est(RewardBatch(scores={"x": x, "y": y}, weights={"x": wx, "y": wy}), rollout).values
    moved = {"x": x, "y": scale * y + shift / 4} if which else {"x": scale * x + shift / 4, "y": y}
    after = est(RewardBatch(scores=moved, weights={"x": wx, "y": wy}), rollout).values
    torch.testing.assert_close(after, before, rtol=1e-9, atol=1e-9)


@FAST
@given(grouped(), st.sampled_from([0.5, 1.0, 2.0]), st.booleans())
def test_one_reward_is_normalize_then_sum_whitened_over_the_batch(data, weight, global_std) -> None:
    """One reward of weight w: GDPO equals normalize_then_sum's values (unclipped) whitened over the batch with the
    same eps. Tolerance 1e-5: both start from the same float32 group z-scores (|z| <= sqrt(8) here) and differ only
    in where w z and the whitening round (float32 ulps, ~1e-7 relative); an error of the formula itself (a missed
    eps of 1e-4 over a std near 1, a mean left in) is at least ten times that."""
    r, g = data
    rollout = _rollout(g.tolist())
    batch = RewardBatch(scores={"x": r.float()}, weights={"x": weight})
    kw = {"global_std": global_std, "clip": None}
    then = GroupNorm(GroupNorm.Config(multi_reward="normalize_then_sum", **kw))(batch, rollout).values  # type: ignore[arg-type]
    values = gdpo(**kw)(batch, rollout).values
    s = then.double()
    if bool(s.min() == s.max()):
        expected = torch.zeros_like(s)
    else:
        centred = s - s.mean()
        expected = centred / (centred.square().mean().sqrt() + 1e-4)  # the default eps, biased std
    assert values.dtype == torch.float32
    torch.testing.assert_close(values.double(), expected, rtol=1e-5, atol=1e-5)


def test_a_constant_batch_gives_exact_zeros() -> None:
    """Constant rewards give exact zeros even with eps 0 (no 0/0), and so does whitening a constant batch whose
    float mean need not equal its value exactly."""
    rollout = _rollout([0, 0, 1, 1, 2, 2])
    batch = RewardBatch(scores={"x": torch.full((6,), 0.1), "y": torch.full((6,), -3.0)}, weights={"x": 1.0, "y": 2.0})
    for unbiased in (False, True):
        values = gdpo(eps=0.0, unbiased=unbiased)(batch, rollout).values
        assert torch.equal(values, torch.zeros(6))
    same = torch.full((7,), 0.1, dtype=torch.float64)
    assert torch.equal(batch_whiten(same, eps=0.0), torch.zeros(7, dtype=torch.float64))
    assert torch.equal(batch_whiten(torch.tensor([2.5]), eps=0.0), torch.zeros(1))


def test_by_hand_two_groups() -> None:
    """Rewards (1, 2, 3 | 5, 5, 6), one reward: group z-scores (-z, 0, z | -1/√2, -1/√2, √2) with z = √1.5, then
    whitened over the six."""
    rollout = _rollout([0, 0, 0, 1, 1, 1])
    batch = RewardBatch(scores={"x": torch.tensor([1.0, 2, 3, 5, 5, 6], dtype=torch.float64)}, weights={"x": 1.0})
    z = 1.5**0.5
    a = torch.tensor([-z, 0.0, z, -(0.5**0.5), -(0.5**0.5), 2**0.5], dtype=torch.float64)
    expected = (a - a.mean()) / a.std(unbiased=False)
    torch.testing.assert_close(gdpo(eps=0.0, clip=None)(batch, rollout).values, expected)
    clipped = gdpo(eps=0.0, clip=1.0)(batch, rollout).values
    torch.testing.assert_close(clipped, expected.clamp(-1.0, 1.0))
    assert float(clipped.abs().max()) == 1.0


def test_the_recipe_key_validates() -> None:
    data = tiny_recipe()
    data["advantage"] = {"type": "group_norm", "multi_reward": "gdpo"}
    recipe = recipe_from_dict(data)
    assert recipe.parts["advantage"].config.multi_reward == "gdpo"
    assert "multi_reward = \"gdpo\"" in recipe.to_toml()
    data["advantage"] = {"type": "group_norm", "multi_reward": "gdpo_sum"}
    with pytest.raises(RecipeError) as caught:
        recipe_from_dict(data)
    assert [path for path, _ in caught.value.problems] == ["advantage.multi_reward"]
    line = str(caught.value).splitlines()[1]
    assert line.startswith("  [advantage.multi_reward] ") and "'gdpo'" in line and "'gdpo_sum'" in line
    with pytest.raises(ValueError):
        GroupNorm.Config(multi_reward="gdpo_sum")  # type: ignore[arg-type]
