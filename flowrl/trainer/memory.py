"""A lower bound on one iteration's rollout memory, checked before the first rollout.

A recipe whose batch cannot fit (``group_size = 1000000000``) would otherwise pass every check and die out
of memory minutes later, inside the sampler. The rollout holds at least, per process: the latents of every
rollout at every step it records (``num_steps + 1`` of them, in float32) and the decoded images. That lower
bound is compared with the memory the device has free now; a batch that cannot fit is a recipe error naming
the two keys that size it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from flowrl.recipe import RecipeError


def available_bytes(device: torch.device) -> int | None:
    """Free memory on ``device``: CUDA's free bytes, else Linux's MemAvailable; ``None`` if unknown."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def rollout_bytes(rollouts: int, num_steps: int, latent_shape: Sequence[int], image_pixels: int) -> int:
    """The lower bound: float32 latents at every step and float32 RGB images, for ``rollouts`` rollouts."""
    return 4 * rollouts * ((num_steps + 1) * math.prod(latent_shape) + 3 * image_pixels)


def check_rollout_fits(source: str, prompts_per_step: int, group_size: int, num_steps: int,
                       latent_shape: Sequence[int], image_pixels: int, device: torch.device) -> None:
    """Raise a :class:`RecipeError` naming ``trainer.prompts_per_step`` and ``sampler.group_size`` when even the
    lower bound exceeds the free memory (unknown free memory: no check)."""
    free = available_bytes(device)
    need = rollout_bytes(prompts_per_step * group_size, num_steps, latent_shape, image_pixels)
    if free is None or need <= free:
        return
    problem = (f"{prompts_per_step} prompts x {group_size} rollouts (sampler.group_size) need at least"
               f" {need / 2**30:.1f} GiB for their latents and images, and {device.type} has {free / 2**30:.1f} GiB"
               " free: lower one of the two")
    raise RecipeError(source, [("trainer.prompts_per_step", problem)])
