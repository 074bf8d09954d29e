"""Diffusion-DPO for flow matching (Wallace et al., arXiv 2311.12908, in the flow form): preferred against rejected
image at shared noise, online from each group's rollouts or offline from a preference file."""

from flowrl_zoo.diffusion_dpo.estimator import PreferenceLabels
from flowrl_zoo.diffusion_dpo.loss import DiffusionDPOLoss, dpo_loss, flow_errors, paired
from flowrl_zoo.diffusion_dpo.pairs import preference_rows
from flowrl_zoo.diffusion_dpo.preferences import PreferenceFileError, PreferencePair, read_preferences
from flowrl_zoo.diffusion_dpo.sampler import PreferenceFile, image_side, pair_latents
from flowrl_zoo.diffusion_dpo.times import pair_times

__all__ = [
    "DiffusionDPOLoss",
    "PreferenceFile",
    "PreferenceFileError",
    "PreferenceLabels",
    "PreferencePair",
    "dpo_loss",
    "flow_errors",
    "image_side",
    "pair_latents",
    "pair_times",
    "paired",
    "preference_rows",
    "read_preferences",
]
