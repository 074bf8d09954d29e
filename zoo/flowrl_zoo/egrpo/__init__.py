"""E-GRPO (arXiv 2601.00423): merged high-entropy SDE steps, shared-anchor branching, per-unit advantages.

The sampler (``anchor_branch``) lives in the core: TempFlow-GRPO's per-step branching shares it.
"""

from flowrl_zoo.egrpo.selector import EntropyUnits, greedy_units

__all__ = ["EntropyUnits", "greedy_units"]
