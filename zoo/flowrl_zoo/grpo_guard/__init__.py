"""GRPO-Guard (arXiv 2510.22319): regulated clipping for Flow-GRPO. The PPO ratio is normalised so that its
clip acts alike at every noise level, and each step's surrogate is weighted by 1 / |dt|."""

from flowrl_zoo.grpo_guard.loss import GRPOGuardLoss, normalised_log_ratio

__all__ = ["GRPOGuardLoss", "normalised_log_ratio"]
