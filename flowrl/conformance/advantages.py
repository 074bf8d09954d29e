"""Conformance of advantage estimators (:class:`~flowrl.core.interfaces.AdvantageEstimator`)."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from flowrl.conformance.common import finite, require
from flowrl.core.interfaces import AdvantageEstimator
from flowrl.core.types import Advantages, RewardBatch, Rollout, transition_advantages
from flowrl.trainer.advantage import global_view

# Advantages are float32 of magnitude about 1 to 5 (the clip); a batch joined in another order sums its
# statistics (float64 inside group_normalize) in another order, which moves a float32 result by an ulp or so
# (5e-7 at 5). Anything that depends on the order of groups moves them by far more.
ORDER_TOL = 1e-5
ZERO_TOL = 1e-6  # a group whose every reward is constant gets zero advantages (exact zeros in group_normalize)


def _rewards(names: Mapping[str, float], r: int, seed: int) -> RewardBatch:
    g = torch.Generator().manual_seed(seed)
    return RewardBatch({k: torch.randn(r, generator=g) for k in names}, dict(names))


def _two_processes(rollout: Rollout) -> Rollout:
    """The global batch the trainer builds from two processes that hold the same rollout structure: ids made
    unique across processes, extras joined by their own rules, no images (flowrl.trainer.advantage)."""

    def both(value: Tensor) -> Tensor:
        return torch.cat([value, value])

    return global_view(rollout, both, 2)


def _shapes(estimator: AdvantageEstimator, out: Advantages, rollout: Rollout, rewards: RewardBatch) -> None:
    r = rollout.num_rollouts
    require(isinstance(out, Advantages), estimator, f"must return Advantages, got {type(out).__name__}")
    values = out.values
    require(isinstance(values, Tensor) and tuple(values.shape) == (r,) and values.is_floating_point(), estimator,
            f"values must be a float tensor of shape ({r},), one per rollout")
    require(finite(values), estimator, "advantages must be finite for finite rewards")
    for name, per in out.per_reward.items():
        require(name in rewards.scores, estimator, f"per_reward names '{name}', which is not one of the rewards")
        require(tuple(per.shape) == (r,) and finite(per), estimator,
                f"per_reward['{name}'] must be finite, one per rollout")
    t = rollout.transitions
    if t.node_index is not None and len(t):
        require(out.nodes is not None, estimator, "the sampler's transitions index nodes but no nodes were given")
    if out.nodes is not None:
        require(out.nodes.dim() == 1 and finite(out.nodes), estimator, "nodes must be a finite 1-D tensor")
    if len(t):
        try:
            per_transition = transition_advantages(t, values, out.nodes)
        except (ValueError, IndexError) as error:
            require(False, estimator, f"the transitions cannot take their advantages: {error}")
        require(tuple(per_transition.shape) == (len(t),) and finite(per_transition), estimator,
                "every transition must get a finite advantage")


def _same(a: Advantages, b: Advantages) -> bool:
    nodes = a.nodes is None and b.nodes is None or (
        a.nodes is not None and b.nodes is not None and torch.equal(a.nodes, b.nodes)
    )
    return torch.equal(a.values, b.values) and nodes and a.per_reward.keys() == b.per_reward.keys() and all(
        torch.equal(v, b.per_reward[k]) for k, v in a.per_reward.items()
    )


def check_advantage(
    estimator: AdvantageEstimator, rollout: Rollout, rewards: Mapping[str, float] | None = None, seed: int = 0
) -> Advantages:
    """Rules, on ``rollout`` (a rollout of the sampler the estimator is paired with) and random rewards named
    and weighted as in ``rewards`` (default one reward of weight 1):

    - one finite float advantage per rollout (``values``); ``per_reward`` names only rewards of the batch,
      each finite with one value per rollout; ``nodes`` given whenever the transitions index nodes, so that
      every transition gets a finite advantage (:func:`~flowrl.core.types.transition_advantages`);
    - deterministic: the same rewards give identical advantages;
    - a group (``rollout.group``) whose every reward is constant gets zero advantages (the trainer's health
      figure ``zero_spread`` counts such groups as contributing no gradient);
    - higher is better: with one reward, within every group the advantages do not anti-correlate with it;
    - the order of groups does not matter: the two-process batch the trainer builds (ids made unique, extras
      joined by their rules, no images) gives each process's rollouts the same advantages whichever process
      comes first, up to float rounding.

    An estimator whose advantages come with the rollouts (``reads_rewards = False``: labels of offline data) is
    held instead of the constant-group and higher-is-better rules to giving the same advantages whatever the
    rewards. Returns the advantages of the first batch."""
    names = dict(rewards or {"reward": 1.0})
    r = rollout.num_rollouts
    batch = _rewards(names, r, seed)
    out = estimator(batch, rollout)
    _shapes(estimator, out, rollout, batch)
    require(_same(out, estimator(batch, rollout)), estimator, "the same rewards gave other advantages")

    if not estimator.reads_rewards:
        other = _rewards(names, r, seed + 3)
        require(torch.equal(estimator(other, rollout).values, out.values), estimator,
                "reads_rewards is false but other rewards gave other advantages")
    else:
        _reward_rules(estimator, rollout, batch, r, seed)
    _order_rule(estimator, rollout, names, batch, r, seed)
    return out


def _reward_rules(estimator: AdvantageEstimator, rollout: Rollout, batch: RewardBatch, r: int, seed: int) -> None:
    """Constant groups get zero advantages; with one reward, higher is better within every group."""
    # a constant group: the first group's rewards all set to one value per reward
    first = rollout.group == rollout.group[0]
    flat = RewardBatch({k: torch.where(first, 0.5, v) for k, v in batch.scores.items()}, batch.weights)
    zero = estimator(flat, rollout).values[first]
    require(bool((zero.abs() <= ZERO_TOL).all()), estimator,
            f"a group whose rewards are all equal must get zero advantages, got {zero.tolist()}")

    # higher is better (one reward, so that weights cannot hide the sign)
    one = _rewards({"reward": 1.0}, r, seed + 1)
    values = estimator(one, rollout).values.double()
    total = one.total.double()
    for g in torch.unique(rollout.group):
        members = rollout.group == g
        centred = total[members] - total[members].mean()
        require(float((values[members] * centred).sum()) >= -1e-9, estimator,
                f"group {int(g)}: advantages anti-correlate with the reward (higher reward must be better)")


def _order_rule(
    estimator: AdvantageEstimator, rollout: Rollout, names: dict[str, float], batch: RewardBatch, r: int, seed: int
) -> None:
    """The two-process batch gives each process's rollouts the same advantages whichever process comes first."""
    # the order of groups: processes A then B, or B then A
    view = _two_processes(rollout)
    other = _rewards(names, r, seed + 2)
    ab = RewardBatch({k: torch.cat([batch.scores[k], other.scores[k]]) for k in names}, names)
    ba = RewardBatch({k: torch.cat([other.scores[k], batch.scores[k]]) for k in names}, names)
    out_ab, out_ba = estimator(ab, view), estimator(ba, view)
    require(tuple(out_ab.values.shape) == (2 * r,) and finite(out_ab.values), estimator,
            "the two-process batch must get one finite advantage per rollout")
    swapped = torch.cat([out_ba.values[r:], out_ba.values[:r]])
    require(bool(((out_ab.values - swapped).abs() <= ORDER_TOL).all()), estimator,
            "advantages depend on the order of the groups in the batch (process A then B vs B then A)")
    if out_ab.nodes is not None and out_ba.nodes is not None:
        m = out_ab.nodes.shape[0] // 2
        nodes_swapped = torch.cat([out_ba.nodes[m:], out_ba.nodes[:m]])
        require(bool(((out_ab.nodes - nodes_swapped).abs() <= ORDER_TOL).all()), estimator,
                "node advantages depend on the order of the groups in the batch")
