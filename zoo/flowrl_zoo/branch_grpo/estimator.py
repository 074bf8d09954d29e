"""BranchGRPO's depth-wise advantages on rollout trees (arXiv 2509.06040).

1. Node rewards: a leaf's reward is its rollout's; an inner node's is the mean of the leaves below it
   (``leaf_mean``) or the mean of its children's rewards weighted by the softmax of the children's edge
   log-densities (``logprob_softmax``, computed bottom-up).
2. Depth-wise normalisation: within each tree (prompt) and each depth, ``A = (R - mean) / (std + eps)`` over
   the nodes of that depth, clipped to ``[-clip, clip]``; a depth with one node (the root) gets 0.
3. Each edge parent -> child is trained with the child's advantage (``Advantages.nodes``, indexed by
   ``Transitions.node_index``).
4. Optional width pruning after the last split (see :func:`width_prune`).
"""

from __future__ import annotations

import attrs
import torch
from torch import Tensor

from flowrl import AdvantageEstimator, Advantages, RewardBatch, Rollout, register
from flowrl.core.contracts import needs
from flowrl.parts.advantages import group_normalize
from flowrl_zoo.branch_grpo.tree import TREE, Tree


def node_rewards(tree: Tree, rewards: Tensor, mode: str = "leaf_mean") -> Tensor:
    """One reward per node (float64): leaves take their rollout's; inner nodes aggregate per ``mode``."""
    r = rewards.to(torch.float64)
    m = tree.num_nodes
    if mode == "leaf_mean":
        total = torch.zeros(m, dtype=torch.float64)
        count = torch.zeros(m, dtype=torch.float64)
        node = tree.leaf.clone()
        while bool((node >= 0).any()):
            live = node >= 0
            total.index_add_(0, node[live], r[live])
            count.index_add_(0, node[live], torch.ones_like(r[live]))
            node = torch.where(live, tree.parent[node.clamp(min=0)], node)
        return total / count.clamp(min=1.0)
    if mode == "logprob_softmax":
        value = torch.zeros(m, dtype=torch.float64)
        value[tree.leaf] = r
        lp = tree.log_prob.to(torch.float64)
        lp = torch.where(torch.isfinite(lp), lp, torch.zeros_like(lp))  # std-0 splits: uniform weights
        for d in range(int(tree.depth.max()), 0, -1):
            kids = (tree.depth == d).nonzero().flatten()
            par = tree.parent[kids]
            top = torch.full((m,), -torch.inf, dtype=torch.float64).scatter_reduce(0, par, lp[kids], "amax")
            w = torch.exp(lp[kids] - top[par])
            wsum = torch.zeros(m, dtype=torch.float64).index_add_(0, par, w)
            wr = torch.zeros(m, dtype=torch.float64).index_add_(0, par, w * value[kids])
            parents = par.unique()
            value[parents] = wr[parents] / wsum[parents]
        return value
    raise ValueError(f"unknown node reward mode '{mode}' (leaf_mean or logprob_softmax)")


def depthwise_normalize(
    tree: Tree, values: Tensor, *, eps: float = 1e-4, unbiased: bool = False, clip: float | None = 5.0
) -> Tensor:
    """Group-normalise node values across the nodes of each (tree, depth); a single-node depth gives 0."""
    groups = tree.tree * (int(tree.depth.max()) + 1) + tree.depth
    return group_normalize(values, groups, eps=eps, unbiased=unbiased, clip=clip)


def width_prune(tree: Tree, advantages: Tensor, key: Tensor) -> Tensor:
    """Width pruning after the last split: among the leaves that share a parent, keep the ``max(1, n // 2)``
    with the largest ``key`` (ties: lower node id first) and set the others' advantages to 0."""
    leaves = tree.leaf
    parent = tree.parent[leaves]
    order = torch.argsort(-key[leaves].to(torch.float64), stable=True)
    order = order[torch.argsort(parent[order], stable=True)]  # grouped by parent, best first
    grouped = parent[order]
    start = torch.ones_like(grouped, dtype=torch.bool)
    start[1:] = grouped[1:] != grouped[:-1]
    first = torch.cummax(torch.where(start, torch.arange(len(order)), 0), 0).values
    rank = torch.arange(len(order)) - first
    _, inverse, counts = torch.unique(grouped, return_inverse=True, return_counts=True)
    keep = rank < (counts[inverse] // 2).clamp(min=1)
    out = advantages.clone()
    out[leaves[order[~keep]]] = 0
    return out


@register("advantage", "branch_depthwise")
class DepthwiseAdvantage(AdvantageEstimator):
    """BranchGRPO depth-wise advantages (arXiv 2509.06040): node rewards, normalised per depth within each tree;
    each edge parent -> child trained with the child's advantage. Needs a tree sampler (``branch_tree``).

    ``node_reward``: ``leaf_mean`` (mean of the leaves below a node) or ``logprob_softmax`` (children's rewards
    weighted by the softmax of their edge log-densities, bottom-up). ``width_prune``: ``off``, or after the last
    split keep, per parent, the top half of its leaf children by ``reward`` or by ``abs_advantage`` (the rest
    get advantage 0). ``multi_reward`` as in ``group_norm``. ``values`` (per rollout) are the leaves'.
    """

    provides = frozenset({"node_advantages"})
    requires = (needs("tree", "it normalises node rewards per depth of rollout trees; use the branch_tree sampler"),)

    @attrs.frozen
    class Config:
        node_reward: str = attrs.field(
            default="leaf_mean", validator=attrs.validators.in_(("leaf_mean", "logprob_softmax"))
        )
        eps: float = attrs.field(default=1e-4, validator=attrs.validators.ge(0))
        unbiased: bool = False  # Bessel-corrected std within a depth
        clip: float | None = attrs.field(default=5.0)  # None or 0: no clip
        multi_reward: str = attrs.field(
            default="sum_then_normalize",
            validator=attrs.validators.in_(("sum_then_normalize", "normalize_then_sum")),
        )
        width_prune: str = attrs.field(
            default="off", validator=attrs.validators.in_(("off", "reward", "abs_advantage"))
        )

        @clip.validator
        def _clip(self, attribute: attrs.Attribute, value: float | None) -> None:
            if value is not None and value < 0:
                raise ValueError(f"'clip' must be >= 0 or None, got {value}")

    def _advantages(self, tree: Tree, rewards: Tensor, clip: float | None) -> Tensor:
        c = self.config
        values = node_rewards(tree, rewards, c.node_reward)
        return depthwise_normalize(tree, values, eps=c.eps, unbiased=c.unbiased, clip=clip)

    def __call__(self, rewards: RewardBatch, rollout: Rollout) -> Advantages:
        tree = rollout.extras.get(TREE)
        if not isinstance(tree, Tree):
            raise ValueError(
                "branch_depthwise needs a rollout tree (Rollout.extras['tree']); use the 'branch_tree' sampler"
            )
        c = self.config
        per_node = {k: self._advantages(tree, v, None) for k, v in rewards.scores.items()}
        if c.multi_reward == "sum_then_normalize":
            nodes = self._advantages(tree, rewards.total, c.clip)
        else:
            summed = sum(rewards.weights[k] * a for k, a in per_node.items())
            assert isinstance(summed, Tensor), "a RewardBatch needs at least one score"
            nodes = summed.clamp(-c.clip, c.clip) if c.clip else summed
        if c.width_prune != "off":
            key = node_rewards(tree, rewards.total, c.node_reward) if c.width_prune == "reward" else nodes.abs()
            nodes = width_prune(tree, nodes, key)
        nodes = nodes.to(torch.float32)
        return Advantages(
            values=nodes[tree.leaf],
            per_reward={k: a[tree.leaf].to(torch.float32) for k, a in per_node.items()},
            nodes=nodes,
        )
