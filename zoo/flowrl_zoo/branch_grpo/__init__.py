"""BranchGRPO (arXiv 2509.06040): tree rollouts with shared prefixes, depth-wise advantages, pruning."""

from flowrl_zoo.branch_grpo.estimator import DepthwiseAdvantage, depthwise_normalize, node_rewards, width_prune
from flowrl_zoo.branch_grpo.sampler import BranchTreeSampler, analytic_nfe
from flowrl_zoo.branch_grpo.selector import BranchSplits

__all__ = [
    "BranchSplits",
    "BranchTreeSampler",
    "DepthwiseAdvantage",
    "analytic_nfe",
    "depthwise_normalize",
    "node_rewards",
    "width_prune",
]
