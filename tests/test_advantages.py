import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flowrl.core.types import Conditioning, RewardBatch, Rollout, Transitions
from flowrl.parts.advantages import GroupNorm, group_normalize

FAST = settings(max_examples=60, deadline=None)


@st.composite
def grouped(draw, max_size: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Rewards on a 0.25 grid (a group is constant or has std >= 0.08), arbitrary labels, shuffled rows."""
    sizes = draw(st.lists(st.integers(1, max_size), min_size=1, max_size=5))
    labels = draw(st.lists(st.integers(-100, 1000), min_size=len(sizes), max_size=len(sizes), unique=True))
    groups = torch.tensor([lab for lab, n in zip(labels, sizes, strict=True) for _ in range(n)])
    ints = draw(st.lists(st.integers(-20, 20), min_size=len(groups), max_size=len(groups)))
    rewards = torch.tensor(ints, dtype=torch.float64) / 4
    perm = torch.tensor(draw(st.permutations(range(len(groups)))), dtype=torch.long)
    return rewards[perm], groups[perm]


finite = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)


def reference(r: torch.Tensor, g: torch.Tensor, eps: float, unbiased: bool, global_std: bool) -> torch.Tensor:
    """Straightforward per-group loop."""
    out = torch.zeros_like(r)
    glob = r.std(unbiased=unbiased) if r.numel() > int(unbiased) else torch.tensor(0.0, dtype=r.dtype)
    for label in g.unique():
        m = g == label
        vals = r[m]
        if bool((vals == vals[0]).all()):
            continue
        std = glob if global_std else vals.std(unbiased=unbiased)
        out[m] = (vals - vals.mean()) / (std + eps)
    return out


@FAST
@given(grouped())
def test_mean_zero_std_one(data) -> None:
    r, g = data
    a = group_normalize(r, g, clip=None)
    for label in g.unique():
        m = g == label
        if bool((r[m] == r[m][0]).all()):
            assert bool((a[m] == 0).all())
            continue
        assert abs(float(a[m].mean())) < 1e-9
        raw = float(r[m].std(unbiased=False))
        assert raw >= 0.08
        assert 1 - 2e-4 / raw <= float(a[m].std(unbiased=False)) <= 1 + 1e-9


@FAST
@given(st.lists(finite, min_size=1, max_size=12), st.integers(1, 12), st.booleans(), st.booleans())
def test_constant_group_is_zero_and_nothing_is_nan(values, n, unbiased, global_std) -> None:
    r = torch.tensor(values + [values[0]] * n, dtype=torch.float64)
    g = torch.tensor([i for i in range(len(values))] + [0] * n)  # group 0 holds values[0] n + 1 times
    a = group_normalize(r, g, unbiased=unbiased, global_std=global_std)
    assert torch.isfinite(a).all()
    assert bool((a[g == 0] == 0).all()) and bool((a[1 : len(values)] == 0).all())  # singletons too
    const = torch.full((5,), 0.1, dtype=torch.float64)  # 0.1 * 5 / 5 != 0.1 in floating point
    for eps in (0.0, 1e-4):  # exact: a constant group (min == max) is set to zeros, not computed
        assert torch.equal(group_normalize(const, torch.zeros(5, dtype=torch.long), eps=eps), torch.zeros(5))


@FAST
@given(grouped(), st.data())
def test_positive_affine_invariance_per_group(data, draw) -> None:
    r, g = data
    labels = g.unique()
    n = len(labels)
    scale = torch.tensor(draw.draw(st.lists(st.floats(0.1, 100), min_size=n, max_size=n)))
    shift = torch.tensor(draw.draw(st.lists(st.floats(-100, 100), min_size=n, max_size=n)))
    idx = torch.searchsorted(labels, g)
    mapped = r * scale[idx].double() + shift[idx].double()
    for unbiased in (False, True):  # float64 z-scores of order 1: atol 1e-7 is a relative bound (errors ~1e-14)
        torch.testing.assert_close(
            group_normalize(mapped, g, eps=0.0, clip=None, unbiased=unbiased),
            group_normalize(r, g, eps=0.0, clip=None, unbiased=unbiased),
            atol=1e-7,
            rtol=0,
        )


@FAST
@given(grouped(), st.data(), st.booleans(), st.booleans())
def test_permutation_and_relabelling(data, draw, unbiased, global_std) -> None:
    r, g = data
    kw = {"unbiased": unbiased, "global_std": global_std}
    a = group_normalize(r, g, **kw)
    perm = torch.tensor(draw.draw(st.permutations(range(len(r)))), dtype=torch.long)
    torch.testing.assert_close(group_normalize(r[perm], g[perm], **kw), a[perm], atol=1e-12, rtol=0)
    labels = g.unique()
    new = torch.tensor(
        draw.draw(st.lists(st.integers(0, 10**6), min_size=len(labels), max_size=len(labels), unique=True))
    )
    relabelled = new[torch.searchsorted(labels, g)]
    # exact: new labels keep each group's members and the order they are summed in
    torch.testing.assert_close(group_normalize(r, relabelled, **kw), a, atol=0, rtol=0)


@FAST
@given(grouped(max_size=40), st.floats(0.1, 5.0), st.booleans(), st.booleans())
def test_clip_bounds_and_options_match_reference(data, clip, unbiased, global_std) -> None:
    r, g = data
    a = group_normalize(r, g, clip=clip, unbiased=unbiased, global_std=global_std)
    assert float(a.abs().max()) <= clip
    want = reference(r, g, 1e-4, unbiased, global_std).clamp(-clip, clip)
    torch.testing.assert_close(a, want, atol=1e-9, rtol=1e-9)
    unclipped = group_normalize(r, g, clip=None, unbiased=unbiased, global_std=global_std)
    torch.testing.assert_close(unclipped, reference(r, g, 1e-4, unbiased, global_std), atol=1e-9, rtol=1e-9)
    assert torch.equal(group_normalize(r, g, clip=0, unbiased=unbiased, global_std=global_std), unclipped)  # no clip


def test_clip_activates_and_unbiased_by_hand() -> None:
    r = torch.zeros(30, dtype=torch.float64)
    r[0] = 1.0  # the outlier of 30 has biased z = sqrt(29) > 5
    g = torch.zeros(30, dtype=torch.long)
    assert float(group_normalize(r, g, eps=0.0, clip=None)[0]) == pytest.approx(math.sqrt(29))
    assert float(group_normalize(r, g, eps=0.0)[0]) == 5.0  # clamped: the bound itself
    a = group_normalize(torch.tensor([1.0, 2, 3]), torch.zeros(3, dtype=torch.long), eps=0.0, unbiased=True)
    torch.testing.assert_close(a, torch.tensor([-1.0, 0.0, 1.0]))
    assert a.dtype == torch.float32
    single = group_normalize(torch.tensor([4.0]), torch.tensor([2]), unbiased=True)
    assert torch.equal(single, torch.zeros(1))


def test_global_std_by_hand() -> None:
    r = torch.tensor([0.0, 2.0, 6.0, 8.0], dtype=torch.float64)
    g = torch.tensor([0, 0, 1, 1])
    z = 1 / math.sqrt(10)  # batch mean 4, batch variance (16 + 4 + 4 + 16) / 4 = 10; each group's std is 1
    a = group_normalize(r, g, eps=0.0, global_std=True)
    torch.testing.assert_close(a, torch.tensor([-z, z, -z, z], dtype=torch.float64))
    per_group = torch.tensor([-1.0, 1, -1, 1], dtype=torch.float64)
    torch.testing.assert_close(group_normalize(r, g, eps=0.0), per_group)


def _rollout(group: list[int]) -> Rollout:
    r = len(group)
    transitions = Transitions(
        inputs=torch.zeros(1, 2),
        input_s=torch.ones(1),
        input_cond=torch.zeros(1, dtype=torch.long),
        input_index=torch.zeros(r, dtype=torch.long),
        s_next=torch.zeros(r),
        x_next=torch.zeros(r, 2),
        log_prob=torch.zeros(r),
        rollout_index=torch.arange(r),
        unit_index=torch.zeros(r, dtype=torch.long),
        weight=torch.ones(r),
    )
    return Rollout(
        prompts=["a", "b"],
        cond=Conditioning({"emb": torch.zeros(2, 3)}),
        images=torch.zeros(r, 3, 2, 2),
        rollout_prompt=torch.tensor(group),
        group=torch.tensor(group),
        transitions=transitions,
        nfe=0,
    )


def _est(**kw) -> GroupNorm:
    return GroupNorm(GroupNorm.Config(eps=0.0, **kw))


def test_estimator_by_hand() -> None:
    rollout = _rollout([0, 0, 0, 1, 1, 1])
    rewards = RewardBatch(
        scores={"hps": torch.tensor([1.0, 2, 3, 5, 5, 5]), "clip": torch.tensor([0.0, 0, 3, 1, 2, 3])},
        weights={"hps": 1.0, "clip": 2.0},
    )
    z = math.sqrt(1.5)  # the biased z-score of 3 in (1, 2, 3)
    # sum first: totals (1, 2, 9) and (7, 9, 11)
    out = _est()(rewards, rollout)
    t = torch.tensor([1.0, 2.0, 9.0])
    torch.testing.assert_close(out.values[:3], (t - t.mean()) / t.std(unbiased=False))
    torch.testing.assert_close(out.values[3:], torch.tensor([-z, 0.0, z]))
    torch.testing.assert_close(out.per_reward["hps"], torch.tensor([-z, 0.0, z, 0.0, 0.0, 0.0]))
    clip_adv = torch.tensor([-1 / math.sqrt(2), -1 / math.sqrt(2), math.sqrt(2), -z, 0.0, z])
    torch.testing.assert_close(out.per_reward["clip"], clip_adv)
    # normalise each reward, then the weighted sum
    then = _est(multi_reward="normalize_then_sum")(rewards, rollout)
    torch.testing.assert_close(then.values, out.per_reward["hps"] + 2.0 * clip_adv)
    assert set(then.per_reward) == {"hps", "clip"}
    clipped = _est(multi_reward="normalize_then_sum", clip=2.0)(rewards, rollout)
    assert float(clipped.values.abs().max()) == 2.0
    with pytest.raises(ValueError):
        GroupNorm.Config(multi_reward="mean")


@FAST
@given(grouped(), st.booleans(), st.booleans())
def test_single_reward_modes(data, global_std, unbiased) -> None:
    """One reward of weight 1: the modes agree (with or without global std). Weight w: they differ by w."""
    r, g = data
    rollout = _rollout(g.tolist())
    kw = {"global_std": global_std, "unbiased": unbiased}
    one = RewardBatch(scores={"x": r}, weights={"x": 1.0})
    then_one = _est(multi_reward="normalize_then_sum", **kw)(one, rollout).values
    # exact: both modes normalise r itself (0 + 1.0 * r is r) and clip once
    assert torch.equal(_est(**kw)(one, rollout).values, then_one)
    two = RewardBatch(scores={"x": r}, weights={"x": 2.0})
    first = _est(clip=None, **kw)(two, rollout).values  # scale-invariant: normalise(2 r) = normalise(r)
    then = _est(clip=None, multi_reward="normalize_then_sum", **kw)(two, rollout).values
    torch.testing.assert_close(then, 2.0 * first)
