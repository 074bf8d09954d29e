"""AEGPO (arXiv 2602.06825): attention entropy decides where (local) and how much (global) to explore.

Two parts wrap any host method: the ``aegpo_topk`` selector (SDE steps at the peaks of Entropy(t)) and
the ``aegpo_allocate`` sampler (a fixed rollout budget split by ΔEntropy, then the host sampler runs).
"""

from flowrl_zoo.aegpo.allocation import allocate, allocation_weights, delta_entropy, group_sizes
from flowrl_zoo.aegpo.probe import entropy_curves, probe_noise, velocity_and_entropy
from flowrl_zoo.aegpo.sampler import EntropyAllocation
from flowrl_zoo.aegpo.selector import AttentionEntropyTopK, egrpo_merge, ranked_steps

__all__ = [
    "AttentionEntropyTopK",
    "EntropyAllocation",
    "allocate",
    "allocation_weights",
    "delta_entropy",
    "egrpo_merge",
    "entropy_curves",
    "group_sizes",
    "probe_noise",
    "ranked_steps",
    "velocity_and_entropy",
]
