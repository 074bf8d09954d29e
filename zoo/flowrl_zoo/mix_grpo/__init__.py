"""MixGRPO (arXiv 2507.21802): SDE inside a sliding window of steps, ODE outside; Flash: a second-order ODE
solver with fewer steps after the window."""

from flowrl_zoo.mix_grpo.sampler import MixGRPOFlashSampler, window_end
from flowrl_zoo.mix_grpo.selector import MixGRPOWindow

__all__ = ["MixGRPOFlashSampler", "MixGRPOWindow", "window_end"]
