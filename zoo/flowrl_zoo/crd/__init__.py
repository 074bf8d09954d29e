"""Centered Reward Distillation (CRD, arXiv 2603.14128): forward-process RL that fits the policy's implicit
reward against a lagged copy of itself to the external reward, both centred within each prompt."""

from flowrl_zoo.crd.loss import CRDLoss, adaptive_velocity_error, group_centred

__all__ = ["CRDLoss", "adaptive_velocity_error", "group_centred"]
