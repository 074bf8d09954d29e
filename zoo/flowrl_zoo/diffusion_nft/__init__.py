"""DiffusionNFT (arXiv 2509.16117): online RL on the forward process with implicit positive and negative
policies; no log-densities, so any sampler works."""

from flowrl_zoo.diffusion_nft.loss import (
    DiffusionNFTLoss,
    adaptive_x0_loss,
    optimality,
    ramp_decay,
    stratified_levels,
)
from flowrl_zoo.diffusion_nft.selector import NFTRollouts

__all__ = ["DiffusionNFTLoss", "NFTRollouts", "adaptive_x0_loss", "optimality", "ramp_decay", "stratified_levels"]
