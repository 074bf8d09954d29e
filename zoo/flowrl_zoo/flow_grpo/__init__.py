"""Flow-GRPO (arXiv 2505.05470): every step SDE with the Flow-GRPO kernel, train the first fraction."""

from flowrl_zoo.flow_grpo.selector import FlowGRPOPrefix

__all__ = ["FlowGRPOPrefix"]
