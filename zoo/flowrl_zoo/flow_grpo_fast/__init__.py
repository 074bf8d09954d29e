"""Flow-GRPO-Fast (arXiv 2505.05470): a random SDE window of 2-3 early steps, ODE elsewhere, train the window."""

from flowrl_zoo.flow_grpo_fast.selector import FlowGRPOFastWindow

__all__ = ["FlowGRPOFastWindow"]
