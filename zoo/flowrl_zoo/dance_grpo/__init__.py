"""DanceGRPO (arXiv 2505.07818): every step SDE with the DanceGRPO kernel, a random subset trained."""

from flowrl_zoo.dance_grpo.selector import DanceRandomSubset

__all__ = ["DanceRandomSubset"]
