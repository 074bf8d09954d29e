"""What the loop does differently with several processes: complete groups and global statistics.

Each process samples whole groups for its slice of the prompts. Advantages are computed on the gathered
global batch (so a global std, or any statistic across groups, is the same as on one process) and each
process keeps its own slice. A rollout tree (``Rollout.tree``) is gathered too, its node ids re-based per
process, and each process keeps its own nodes' advantages (``Advantages.nodes``); every process must hold
the same number of nodes (the plan is the same everywhere). Logged scalars are means (NFE: sums) over processes.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch
from torch import Tensor

from flowrl.interfaces import AdvantageEstimator
from flowrl.types import Advantages, RewardBatch, Rollout, Tree


def gather(accelerator: Any, value: Tensor) -> Tensor:
    """All processes' tensors concatenated along dim 0, in process order (same length on each)."""
    if accelerator.num_processes == 1:
        return value
    return accelerator.gather(value.to(accelerator.device)).cpu()  # type: ignore[no-any-return]


def global_advantages(
    accelerator: Any, estimator: AdvantageEstimator, rewards: RewardBatch, rollout: Rollout
) -> Advantages:
    """Advantages computed on the global batch; this process's slice is returned."""
    if accelerator.num_processes == 1:
        return estimator(rewards, rollout)
    r, rank = rollout.num_rollouts, accelerator.process_index
    offset = torch.arange(accelerator.num_processes).repeat_interleave(r)
    groups = _global_ids(accelerator, rollout.group, offset)
    view = attrs.evolve(
        rollout,
        group=groups,
        rollout_prompt=_global_ids(accelerator, rollout.rollout_prompt, offset),
        rollout_unit=gather(accelerator, rollout.rollout_unit) if rollout.rollout_unit is not None else None,
        images=torch.empty((len(groups), 0)),
        tree=_global_tree(accelerator, rollout.tree, r) if rollout.tree is not None else None,
    )
    scores = {k: gather(accelerator, v) for k, v in rewards.scores.items()}
    full = estimator(RewardBatch(scores, rewards.weights), view)
    mine = slice(rank * r, (rank + 1) * r)
    nodes = None
    if full.nodes is not None and rollout.tree is not None:
        m = rollout.tree.num_nodes
        nodes = full.nodes[rank * m : (rank + 1) * m]
    per_reward = {k: v[mine] for k, v in full.per_reward.items()}
    return Advantages(values=full.values[mine], per_reward=per_reward, nodes=nodes)


def _global_tree(accelerator: Any, tree: Tree, rollouts: int) -> Tree:
    """Every process's tree nodes, process k's ids shifted past lower processes' (same node count on each)."""
    m = tree.num_nodes
    process = torch.arange(accelerator.num_processes)
    parent = gather(accelerator, tree.parent)
    parent = torch.where(parent >= 0, parent + process.repeat_interleave(m) * m, parent)
    return Tree(
        parent=parent,
        depth=gather(accelerator, tree.depth),
        tree=_global_ids(accelerator, tree.tree, process.repeat_interleave(m)),
        log_prob=gather(accelerator, tree.log_prob),
        leaf=gather(accelerator, tree.leaf) + process.repeat_interleave(rollouts) * m,
    )


def _global_ids(accelerator: Any, ids: Tensor, offset: Tensor) -> Tensor:
    """Local ids made unique across processes: process k's ids shifted past every lower process's."""
    width = int(gather(accelerator, ids.max().reshape(1)).max()) + 1
    return gather(accelerator, ids) + offset * width


def reduce_metrics(accelerator: Any, metrics: dict[str, Any], summed: tuple[str, ...] = ()) -> dict[str, Any]:
    """Mean over processes of every numeric metric (sum for the keys in ``summed``)."""
    if accelerator.num_processes == 1:
        return metrics
    keys = [k for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)]
    values = torch.tensor([float(metrics[k]) for k in keys], dtype=torch.float64, device=accelerator.device)
    total = accelerator.reduce(values, reduction="sum").cpu()
    out = dict(metrics)
    for k, v in zip(keys, total.tolist(), strict=True):
        out[k] = v if k in summed else v / accelerator.num_processes
        if isinstance(metrics[k], int) and k in summed:
            out[k] = int(round(out[k]))
    return out
