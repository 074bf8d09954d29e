"""E-GRPO (arXiv 2601.00423): merged high-entropy SDE steps, shared-anchor branching, per-unit advantages, and the
multi-granularity form (every jump also finished on coarser ODE grids, advantages summed over granularities).

The per-unit sampler (``anchor_branch``) lives in the core: TempFlow-GRPO's per-step branching shares it.
"""

from flowrl_zoo.egrpo.advantage import MultiGranularAdvantage, multi_granular
from flowrl_zoo.egrpo.sampler import GranularAnchorBranch, stride_grid, stride_tail
from flowrl_zoo.egrpo.selector import EntropyUnits, greedy_units

__all__ = [
    "EntropyUnits",
    "GranularAnchorBranch",
    "MultiGranularAdvantage",
    "greedy_units",
    "multi_granular",
    "stride_grid",
    "stride_tail",
]
