"""First-frame consistency: an image-to-video reward that reads the condition.

An image-to-video base is given each prompt's first frame; this reward scores how close the generated clip's first
frame stays to it. The condition is fitted to the clip's frame size by the rule the Wan image-to-video base uses
(:func:`~flowrl.core.conditions.fit_frame`: scaled to cover, centre-cropped), so a clip that reproduces its input
exactly scores the maximum. Two measures (``metric``):

* ``pixel``: ``1 - mean |frame - condition|`` over pixels and channels in [0, 1]; 1 for an exact copy, 0 for the
  opposite colour everywhere; no weights.
* ``clip``: the cosine of the two images' L2-normalised projected CLIP embeddings (the embeddings flowrl's
  CLIP rewards use, :func:`flowrl.rewards.clip_rewards.image_embeddings`), tolerant of small shifts and noise; about
  1 for the same picture.

A video reward (``video = True``): it receives whole clips ``(B, F, 3, H, W)`` and reads frame 0; an image batch
``(B, 3, H, W)`` (a one-frame clip) is read as the first frames. Reported as ``(raw - offset) * scale``.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs
import torch
from attrs.validators import gt
from torch import Tensor

from flowrl.core.choices import one_of
from flowrl.core.conditions import conditions_of, fit_frame
from flowrl.core.registry import register
from flowrl.rewards.base import DType, ModelReward
from flowrl.rewards.preprocess import Resize

Metric = Literal["pixel", "clip"]


def first_frames(images: Tensor) -> Tensor:
    """Each clip's first frame ``(B, 3, H, W)``; images pass through."""
    return images[:, 0] if images.dim() == 5 else images


def condition_frames(prompts: list[str], height: int, width: int, where: str) -> Tensor:
    """Each prompt's first condition image fitted to ``height x width``, ``(B, 3, H, W)`` in [0, 1]; a
    ``ValueError`` starting with ``where`` for a prompt without an RGB condition."""
    out = []
    for prompt in prompts:
        conditions = conditions_of(prompt)
        if not conditions or conditions[0].mode != "RGB":
            found = f"a {conditions[0].mode} image" if conditions else "no condition image"
            raise ValueError(f"{where} compares a clip's first frame with its prompt's RGB first frame; "
                             f"{str(prompt)[:40]!r} has {found}")
        out.append(fit_frame(conditions[0], width, height))
    return torch.stack(out)


@register("reward", "first_frame_consistency")
class FirstFrameConsistency(ModelReward):
    """Image-to-video: how close the clip's first frame stays to the prompt's first frame (``pixel``: 1 - mean
    absolute difference; ``clip``: cosine of CLIP image embeddings); needs prompts with a first frame."""

    video = True
    extra = "clip"

    @attrs.frozen
    class Config:
        metric: Metric = attrs.field(default="pixel", validator=one_of(Metric))  # pixel (no weights) | clip
        model: str = "openai/clip-vit-large-patch14"  # metric = clip: CLIPModel folder or hub id
        scale: float = 1.0  # reported = (raw - offset) * scale
        offset: float = 0.0
        device: str = "auto"  # auto: the images' device, else cuda if available, else cpu
        dtype: DType = attrs.field(default="float32", validator=one_of(DType))
        batch_size: int = attrs.field(default=32, validator=gt(0))  # image pairs per CLIP forward
        resize: Resize = attrs.field(default="pil", validator=one_of(Resize))

    @classmethod
    def needs_conditions(cls, config: Config) -> bool:
        return True  # the first frame the clip was generated from

    def check(self) -> None:
        if self.config.metric == "clip":
            super().check()

    def check_paths(self) -> None:
        self.require_model(self.config.model, "model")

    def load(self, device: torch.device) -> Any:
        from flowrl.rewards.clip_rewards import load_clip

        return load_clip(self.config.model, self.config.model, device, self.config.dtype, self.config.resize)

    @torch.no_grad()
    def score(self, images: Tensor, prompts: list[str]) -> Tensor:
        self.check_prompts(images, prompts)
        frames = first_frames(images).float()
        wanted = condition_frames(prompts, int(frames.shape[-2]), int(frames.shape[-1]), self.label)
        if self.config.metric == "pixel":
            raw = 1.0 - (frames.cpu() - wanted).abs().mean((1, 2, 3))
            return self.rescale(raw)
        from flowrl.rewards.clip_rewards import image_embeddings

        bundle = self.model(images)
        parts = []
        for s in self.batches(frames, prompts, self.config.batch_size):
            a = image_embeddings(bundle, frames[s], self.device)
            b = image_embeddings(bundle, wanted[s], self.device)
            parts.append((a * b).sum(-1))
        return self.rescale(torch.cat(parts) if parts else torch.zeros(0))
