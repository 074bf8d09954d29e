"""E-GRPO (arXiv 2601.00423): merged high-entropy SDE steps, shared-anchor branching, per-unit advantages."""

from flowrl_zoo.egrpo.sampler import AnchorBranchSampler
from flowrl_zoo.egrpo.selector import EntropyUnits, greedy_units, merged_entropy

__all__ = ["AnchorBranchSampler", "EntropyUnits", "greedy_units", "merged_entropy"]
