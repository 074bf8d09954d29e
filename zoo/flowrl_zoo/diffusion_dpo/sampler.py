"""Offline Diffusion-DPO: a "sampler" that reads preference pairs from a file instead of generating images."""

from __future__ import annotations

import attrs
import torch
from torch import Tensor

from flowrl import register
from flowrl.core.conditions import fit_square
from flowrl.core.contracts import needs
from flowrl.core.extras import PerRollout
from flowrl.core.interfaces import Backbone, RolloutSampler
from flowrl.core.rng import RolloutRNG
from flowrl.core.types import Plan, Rollout, Schedule
from flowrl.parts.samplers.walk import empty_transitions
from flowrl_zoo.diffusion_dpo.preferences import PreferenceFileError, read_preferences

LABEL = "preference"  # Rollout.extras key: +1 for a preferred image, -1 for a rejected one


def image_side(backbone: Backbone) -> tuple[int, torch.device]:
    """The side of the square images the backbone makes (one decode of a noise latent) and the device of its
    latents; a :class:`PreferenceFileError` for a base whose images are not square."""
    with torch.no_grad():
        noise = backbone.noise(1, torch.Generator().manual_seed(0))
        shape = tuple(backbone.decode(noise).shape)
    if len(shape) != 4 or shape[-1] != shape[-2]:
        raise PreferenceFileError(
            f"[sampler] preference_file: backbone {type(backbone).__name__} makes images of shape {shape[1:]}; offline"
            " pairs are fitted to square images only"
        )
    return int(shape[-1]), noise.device


def pair_latents(backbone: Backbone, images: Tensor) -> Tensor:
    """Clean latents of ``images`` (``(B, 3, H, W)`` in [0, 1], the backbone's size) by the backbone's
    ``encode_images``; a :class:`PreferenceFileError` when it has none."""
    encode = getattr(backbone, "encode_images", None)
    try:
        if encode is None:
            raise NotImplementedError
        latents: Tensor = encode(images)
    except NotImplementedError:
        raise PreferenceFileError(
            f"[sampler] preference_file: backbone {type(backbone).__name__} cannot turn images into latents"
            " (encode_images), which offline pairs need; use a pixel-space backbone such as world_tiny"
        ) from None
    if tuple(latents.shape[1:]) != tuple(backbone.latent_shape):  # an encoder that disagrees with its own base
        raise ValueError(f"encode_images gave latents {tuple(latents.shape[1:])}, expected {backbone.latent_shape}")
    return latents


@register("sampler", "preference_file")
class PreferenceFile(RolloutSampler):
    """Preference pairs from a JSONL file (offline Diffusion-DPO): no image is generated and no transformer runs.

    Each prompt slot of an iteration draws one record of the file (uniformly, with replacement, from the slot's own
    random stream) and becomes a group of two rollouts, the preferred image then the rejected one, with their
    latents as ``final_latents`` and ``extras["preference"]`` = +1 / -1 (the ``preference`` estimator's
    advantages). Images of another size than the backbone's are scaled (bicubic) so their short side is its side,
    then centre-cropped (the rule for condition images); the backbone must turn images into latents
    (``encode_images``: the pixel-space bases, world_tiny among them). The prompt source sets how many pairs an
    iteration trains (``trainer.prompts_per_step``) and the held-out evaluation; its training prompts' texts are
    not used: the records' prompts are. The file is read and every image checked when the sampler is built,
    before any model loads (:func:`~flowrl_zoo.diffusion_dpo.preferences.read_preferences`).
    """

    provides = frozenset({"preference_labels"})
    requires = (
        needs("forward_process_loss", "the pairs are finished images with no sampling steps to train"),
    )

    @attrs.frozen
    class Config:
        path: str = ""  # the JSONL preference file (required); relative: to the working directory

    @staticmethod
    def check_config(config: PreferenceFile.Config) -> list[tuple[str, str]]:
        why = "sampler 'preference_file' reads its pairs from a file: give its path (JSONL: prompt, chosen, rejected)"
        return [] if config.path else [("path", why)]

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.pairs = read_preferences(config.path)
        self.side: tuple[int, torch.device] | None = None  # the backbone's image side and device (first rollout)

    def rollout_count(self, plan: Plan, num_prompts: int) -> int:
        return 2 * num_prompts

    def rollout(
        self, backbone: Backbone, prompts: list[str], plan: Plan, schedule: Schedule, rng: RolloutRNG
    ) -> Rollout:
        index = [int(torch.randint(len(self.pairs), (1,), generator=g)) for g in rng.generators[: len(prompts)]]
        records = [self.pairs[i] for i in index]
        if self.side is None:
            self.side = image_side(backbone)
        side, device = self.side
        images = torch.stack([fit_square(img, side) for r in records for img in (r.chosen, r.rejected)])
        latents = pair_latents(backbone, images.to(device))
        texts = [r.prompt for r in records]
        rows = torch.arange(len(records)).repeat_interleave(2)
        labels = torch.tensor([1.0, -1.0]).repeat(len(records))
        return Rollout(
            prompts=texts, cond=backbone.encode(texts), images=images, rollout_prompt=rows, group=rows.clone(),
            transitions=empty_transitions(), nfe=0, final_latents=latents, extras={LABEL: PerRollout(labels)},
        )
