"""``edit_feature_similarity``: how much of the source an edit kept, as the cosine of two images' DINOv2 features.

The feature-space companion of ``edit_preservation`` (pixel SSIM, :mod:`flowrl.rewards.preservation`). A pixel
measure punishes a global edit (a style, a season, the tone) as hard as a ruined picture; a self-supervised image
feature keeps the identity of the scene and its objects and lets their rendering change, so a restyled photograph of
the same room stays close to its source while another room does not. DINOv2 (Oquab et al., 2023) is the usual
choice for such a similarity: DreamBooth's DINO score measures subject fidelity with its predecessor's features, and
VBench's subject consistency uses DINO features too. The price is a model's weights and blind spots: what the
features ignore (a colour cast, fine texture) is not penalised, which is why a recipe pairs this with a judge and
may add the pixel term as well.

Any transformers vision model works whose output has a pooled embedding: DINOv2 (``Dinov2Model``: the CLS token
after the final layer norm, ``pooler_output``; the default ``facebook/dinov2-base``), a ViT, or CLIP's vision tower
saved as ``CLIPVisionModelWithProjection`` (its projected ``image_embeds``). The model loads from a
``save_pretrained`` folder (or a hub id when the hub is reachable), with the preprocessing of its
``preprocessor_config.json`` done by :mod:`flowrl.rewards.preprocess` (shortest side resized bicubic, centre crop,
the model's mean and std: DINOv2's processor is 256 then 224 with ImageNet's statistics). The source is first
brought to the result's frame by the edit bases' rule (:func:`~flowrl.rewards.preservation.source_like`), so both
images show the same region before the processor crops them alike. Score: ``cos(f(result), f(source))`` in [-1, 1],
1 for identical images up to float rounding.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import torch
from attrs.validators import gt
from torch import Tensor

from flowrl.core.choices import one_of
from flowrl.core.registry import register
from flowrl.rewards.base import DType, ModelReward
from flowrl.rewards.clip_rewards import DTYPES, _read_preprocessor_config, image_preprocess
from flowrl.rewards.preprocess import ImagePreprocess, Resize
from flowrl.rewards.preservation import edit_sources


@attrs.frozen
class FeatureBundle:
    """A loaded vision model with its preprocessing."""

    model: Any
    preprocess: ImagePreprocess
    dtype: torch.dtype


def load_features(name: str, device: torch.device, dtype: str, backend: str) -> FeatureBundle:
    """The vision model at ``name`` (folder or hub id) in eval mode, frozen, with its preprocessing."""
    from transformers import AutoModel
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    local = Path(name).expanduser()
    path = str(local) if local.exists() else name
    model = AutoModel.from_pretrained(path, dtype=DTYPES[dtype]).to(device).eval()
    model.requires_grad_(False)
    return FeatureBundle(model, image_preprocess(_read_preprocessor_config(path), backend), DTYPES[dtype])


def features(bundle: FeatureBundle, images: Tensor, device: torch.device) -> Tensor:
    """L2-normalised pooled embeddings ``(B, D)`` in float32 (``image_embeds`` where the model projects them)."""
    out = bundle.model(pixel_values=bundle.preprocess(images.to(device)).to(bundle.dtype))
    pooled = getattr(out, "image_embeds", None)
    if pooled is None:
        pooled = out.pooler_output
    return torch.nn.functional.normalize(pooled.float(), dim=-1)


@register("reward", "edit_feature_similarity")
class EditFeatureSimilarity(ModelReward):
    """How much of the source an edit kept: cos of DINOv2 (or another vision model's) pooled features (-1 to 1)."""

    @attrs.frozen
    class Config:
        model: str = "facebook/dinov2-base"  # a transformers vision model folder or hub id (and its processor)
        device: str = "auto"  # auto: the images' device, else cuda if available, else cpu
        dtype: DType = attrs.field(default="float32", validator=one_of(DType))
        batch_size: int = attrs.field(default=32, validator=gt(0))  # image pairs per forward
        resize: Resize = attrs.field(default="pil", validator=one_of(Resize))

    @classmethod
    def needs_conditions(cls, config: Config) -> bool:
        return True  # the source image the result is compared with

    def check_paths(self) -> None:
        self.require_model(self.config.model, "model")

    def load(self, device: torch.device) -> FeatureBundle:
        return load_features(self.config.model, device, self.config.dtype, self.config.resize)

    @torch.no_grad()
    def score(self, images: Tensor, prompts: list[str]) -> Tensor:
        chunks = self.batches(images, prompts, self.config.batch_size)
        results = images.detach().float().cpu()
        height, width = results.shape[-2:]
        sources = edit_sources(prompts, height, width, "edit_feature_similarity")
        bundle = self.model(images)
        parts = []
        for s in chunks:
            pair = torch.cat([results[s], torch.stack(sources[s])])  # one forward for results and sources
            embedded = features(bundle, pair, self.device)
            n = results[s].shape[0]
            parts.append((embedded[:n] * embedded[n:]).sum(-1))
        return torch.cat(parts).cpu() if parts else torch.zeros(0)
