"""TempFlow-GRPO (arXiv 2508.04324): per-step branching from an ODE main path, per-(prompt, step) advantages,
noise-aware step weights."""

from flowrl_zoo.tempflow_grpo.sampler import TempFlowBranchSampler, step_std
from flowrl_zoo.tempflow_grpo.selector import TempFlowSteps

__all__ = ["TempFlowBranchSampler", "TempFlowSteps", "step_std"]
