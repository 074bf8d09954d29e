"""The rollout tree a BranchGRPO sampler builds and its estimator reads (``Rollout.extras["tree"]``)."""

from __future__ import annotations

import attrs
from torch import Tensor

from flowrl.core.extras import Extra, Gather, unique_ids

TREE = "tree"  # its name in Rollout.extras


@attrs.define
class Tree(Extra):
    """Rollout trees: one tree per prompt, nodes numbered level by level.

    A root is a prompt's initial latent (depth 0, parent -1); every stochastic split makes ``factor`` children
    of each current node (depth + 1). ``log_prob`` is the old log-density of the edge parent -> node (0 at a
    root); ``leaf[r]`` is the node rollout ``r`` ends at. Node ids index ``Advantages.nodes`` and
    ``Transitions.node_index``.
    """

    parent: Tensor  # (M,) long, -1 for a root
    depth: Tensor  # (M,) long
    tree: Tensor  # (M,) long: the tree (prompt row) a node belongs to
    log_prob: Tensor  # (M,) fp32
    leaf: Tensor  # (R,) long

    @property
    def num_nodes(self) -> int:
        return int(self.parent.shape[0])

    def gathered(self, gather: Gather, processes: int) -> Tree:
        """Every process's nodes, process ``k``'s node ids shifted by ``k`` times the node count (the same on
        every process) and its tree ids past every lower process's."""
        m = self.num_nodes
        return Tree(
            parent=unique_ids(gather, self.parent, processes, per_process=m),
            depth=gather(self.depth),
            tree=unique_ids(gather, self.tree, processes),
            log_prob=gather(self.log_prob),
            leaf=unique_ids(gather, self.leaf, processes, per_process=m),
        )
