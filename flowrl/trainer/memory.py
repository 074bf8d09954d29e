"""A lower bound on one iteration's rollout memory, checked before the first rollout.

A recipe whose batch cannot fit (``group_size = 1000000000``) would otherwise pass every check and die out
of memory minutes later, inside the sampler. The rollout holds at least, per process: the latents of every
rollout at every step it records (``num_steps + 1`` of them, in float32) and the decoded images. That lower
bound is compared with the memory the device has free now; a batch that cannot fit is a recipe error naming
the two keys that size it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from flowrl.config.recipe import Recipe, RecipeError
from flowrl.core.interfaces import RolloutSampler
from flowrl.core.types import Plan, Unit

if TYPE_CHECKING:
    from flowrl.trainer.parts import RunParts


def available_bytes(device: torch.device) -> int | None:
    """Free memory on ``device``: CUDA's free bytes, else Linux's MemAvailable; ``None`` if unknown."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return _meminfo("MemAvailable:")


def total_bytes(device: torch.device) -> int | None:
    """All of ``device``'s memory: CUDA's total, else Linux's MemTotal; ``None`` if unknown."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[1])
    return _meminfo("MemTotal:")


def used_bytes(device: torch.device) -> int | None:
    """What this process holds on ``device`` now: CUDA's allocated bytes, else the resident set; ``None`` if
    unknown."""
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def peak_bytes(device: torch.device) -> int | None:
    """The most this process has held so far: CUDA's peak allocated bytes, else its peak resident set."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    try:
        import resource
    except ImportError:  # not on Linux or macOS
        return None
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _meminfo(key: str) -> int | None:
    try:
        with open("/proc/meminfo") as info:
            for line in info:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def rollout_bytes(rollouts: int, num_steps: int, latent_shape: Sequence[int], image_pixels: int) -> int:
    """The lower bound: float32 latents at every step and float32 RGB images, for ``rollouts`` rollouts."""
    return 4 * rollouts * ((num_steps + 1) * math.prod(latent_shape) + 3 * image_pixels)


class RolloutFits:
    """The pre-check, made twice: when the trainer is built, with the smallest plan a sampler can be given (one
    trained unit: a lower bound for every sampler, before the first evaluation), and before the first rollout,
    with that iteration's plan (a tree's or an anchor's groups depend on the plan's units)."""

    SMALLEST = Plan(units=(Unit(0),), trained=(0,))

    def __init__(self, source: str, sampler: RolloutSampler, num_steps: int, latent_shape: Sequence[int],
                 image_pixels: int, device: torch.device) -> None:
        self.source, self.sampler, self.num_steps = source, sampler, num_steps
        self.latent_shape, self.image_pixels, self.device = tuple(latent_shape), image_pixels, device
        self.planned = False  # checked with a real plan

    @classmethod
    def of(cls, recipe: Recipe, parts: RunParts, device: torch.device) -> RolloutFits:
        """The pre-check of a run's parts, made at once with the smallest plan (``trainer.prompts_per_step``
        prompts); the rollout phase makes it again with the first iteration's plan."""
        backbone, num_steps = parts.backbone, recipe.schedule.num_steps
        pixels = int(getattr(backbone.config, "resolution", 0)) ** 2
        fits = cls(recipe.source, parts.sampler, num_steps, backbone.latent_shape, pixels, device)
        fits.check(recipe.trainer.prompts_per_step)
        return fits

    def check(self, prompts: int, plan: Plan | None = None) -> None:
        """Raise a :class:`RecipeError` when ``prompts`` prompts' rollouts under ``plan`` (None: the smallest)
        cannot fit; with a plan, only the first time."""
        if plan is not None:
            if self.planned:
                return
            self.planned = True
        rollouts = self.sampler.rollout_count(plan or self.SMALLEST, prompts)
        free = available_bytes(self.device)
        need = rollout_bytes(rollouts, self.num_steps, self.latent_shape, self.image_pixels)
        if free is None or need <= free:
            return
        name = self.sampler.registered_name or type(self.sampler).__name__
        groups = "sampler.group_size" if plan is None else f"'{name}' under the first iteration's plan"
        each = rollouts // prompts if rollouts % prompts == 0 else round(rollouts / prompts, 2)
        problem = (f"{prompts} prompts x {each} rollouts ({groups}) need at least"
                   f" {need / 2**30:.1f} GiB for their latents and images, and {self.device.type} has"
                   f" {free / 2**30:.1f} GiB free: lower one of the two")
        raise RecipeError(self.source, [("trainer.prompts_per_step", problem)])
