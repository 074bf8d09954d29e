"""Signals of a run's health, computed every iteration from what the rollout already holds (no extra model call).

Reward hacking and lost exploration show in the samples before they show in the evaluation: a policy that
collapses onto one image per prompt, or whose groups all score alike, stops learning. Two cheap signals
catch both:

- ``health/diversity``: within each group, the root-mean-square pixel distance between two of its images
  (images in [0, 1], average-pooled to at most 64 x 64 so a 1024 px rollout costs no more than a small
  one), averaged over the group's pairs, then over groups. 0 when every group is one image repeated.
- ``health/zero_spread``: the share of groups whose total rewards are all equal (within 1e-6). Such a
  group has zero advantages and contributes no gradient.
"""

from __future__ import annotations

import torch
from torch import Tensor

POOLED = 64  # side of the images the distance is measured on
EQUAL = 1e-6  # rewards closer than this count as equal


def rollout_health(images: Tensor, group: Tensor, total: Tensor) -> dict[str, float]:
    """``health/diversity`` and ``health/zero_spread`` of one rollout batch.

    ``images`` (R, 3, H, W) in [0, 1]; ``group`` (R,) the group id of each image; ``total`` (R,) its total
    reward. Groups of one image count for neither figure."""
    pixels = images.detach().float().cpu()
    if max(pixels.shape[-2:]) > POOLED:
        pixels = torch.nn.functional.adaptive_avg_pool2d(pixels, POOLED)
    flat = pixels.flatten(1)
    distances, flat_groups = [], 0
    for g in torch.unique(group):
        members = (group == g).nonzero().flatten()
        if len(members) < 2:
            continue
        x = flat[members]
        pair = torch.cdist(x, x) / x.shape[1] ** 0.5  # RMS distance per pixel value
        n = len(members)
        distances.append(float(pair.sum()) / (n * (n - 1)))  # the diagonal is 0
        rewards = total[members]
        flat_groups += int(float(rewards.max() - rewards.min()) <= EQUAL)
    if not distances:
        return {}
    return {"health/diversity": sum(distances) / len(distances), "health/zero_spread": flat_groups / len(distances)}
