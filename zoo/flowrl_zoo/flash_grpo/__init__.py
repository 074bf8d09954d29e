"""Flash-GRPO (arXiv 2605.15980): one SDE step per rollout at a step drawn per prompt and shared by its group
(iso-temporal grouping), a noise linear in the level, and per-step weights that even out the policy-gradient scale
(temporal gradient rectification)."""

from flowrl_zoo.flash_grpo.kernel import FlashSDEKernel
from flowrl_zoo.flash_grpo.rectification import gradient_scale, rectification_weights, step_scales
from flowrl_zoo.flash_grpo.sampler import IsoTemporalSampler, candidate_pool
from flowrl_zoo.flash_grpo.selector import FlashWindow

__all__ = [
    "FlashSDEKernel",
    "FlashWindow",
    "IsoTemporalSampler",
    "candidate_pool",
    "gradient_scale",
    "rectification_weights",
    "step_scales",
]
