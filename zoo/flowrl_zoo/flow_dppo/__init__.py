"""Flow-DPPO (arXiv 2606.11025): PPO for flow matching with a divergence trust region instead of the ratio
clip; the divergence of two SDE steps is the closed-form Gaussian KL of their means."""

from flowrl_zoo.flow_dppo.loss import FlowDPPOLoss, mean_kl, outside_trust_region

__all__ = ["FlowDPPOLoss", "mean_kl", "outside_trust_region"]
