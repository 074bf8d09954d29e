"""The advantage phase: one advantage per rollout from the rewards, computed on the global batch.

Each process samples whole groups for its slice of the prompts. The estimator sees the gathered batch of every
process (so a global std, or any statistic across groups, is the one a single process would compute) and each
process keeps its own slice. A method's own data (``Rollout.extras``) is gathered by each value's declared rule
(:mod:`flowrl.core.extras`), and each process keeps its own nodes' advantages (``Advantages.nodes``); every process
must hold the same number of nodes (the plan is the same everywhere).
"""

from __future__ import annotations

from typing import Any

import attrs
import torch
from torch import Tensor

from flowrl.core.extras import Gather, unique_ids
from flowrl.core.interfaces import AdvantageEstimator
from flowrl.core.types import Advantages, RewardBatch, Rollout
from flowrl.trainer.distributed import gather


def global_advantages(
    accelerator: Any, estimator: AdvantageEstimator, rewards: RewardBatch, rollout: Rollout
) -> Advantages:
    """Advantages computed on the global batch; this process's slice is returned."""
    if accelerator.num_processes == 1:
        return estimator(rewards, rollout)
    n, rank, r = accelerator.num_processes, accelerator.process_index, rollout.num_rollouts

    def every(value: Tensor) -> Tensor:
        return gather(accelerator, value)

    scores = {k: every(v) for k, v in rewards.scores.items()}
    full = estimator(RewardBatch(scores, rewards.weights), global_view(rollout, every, n))
    mine = slice(rank * r, (rank + 1) * r)
    nodes = None
    if full.nodes is not None:
        m = full.nodes.shape[0] // n  # every process holds the same number of nodes
        nodes = full.nodes[rank * m : (rank + 1) * m]
    per_reward = {k: v[mine] for k, v in full.per_reward.items()}
    return Advantages(values=full.values[mine], per_reward=per_reward, nodes=nodes)


def global_view(rollout: Rollout, gather: Gather, processes: int) -> Rollout:
    """What the estimator sees of every process's rollouts: group and prompt ids made unique across processes,
    extras joined by their own rules, no images (the estimator does not read them)."""
    return attrs.evolve(
        rollout,
        group=unique_ids(gather, rollout.group, processes),
        rollout_prompt=unique_ids(gather, rollout.rollout_prompt, processes),
        images=torch.empty((processes * rollout.num_rollouts, 0)),
        # Sorted: every process makes the same collective calls in the same order.
        extras={name: rollout.extras[name].gathered(gather, processes) for name in sorted(rollout.extras)},
    )
