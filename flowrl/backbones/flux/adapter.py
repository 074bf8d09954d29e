"""The FLUX adapter: a diffusers ``FluxPipeline`` behind flowrl's small :class:`Backbone` interface.

Works in latent space (with the pipeline's VAE) or directly on pixels (``vae=None``: the image is cut
into ``patch x patch`` tokens, the embedded world's tiny model). Only this file touches the pipeline's
modules; algorithms see velocities and images.

Precision: with ``dtype`` bfloat16/float16 the frozen transformer weights are stored in that dtype and
every forward runs under ``torch.autocast`` in it (so fp32 master weights of a full fine-tune, or fp32
LoRA weights, mix safely with them); velocities come back as fp32, and flowrl's transition kernels and
log-densities are always fp32. FLUX.1-dev is guidance-distilled: ``guidance`` is its embedded guidance
value (3.5 in the papers); FLUX.1-schnell has no guidance embedding, and the value is ignored.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Self

import attrs
import torch
from attrs.validators import ge, gt
from torch import Tensor

from flowrl.backbones.common.pipeline import DTYPES, PipelineAdapter, load_from_pretrained, unit_images
from flowrl.backbones.common.probe_options import AttentionEntropyOptions
from flowrl.backbones.common.settings import DType
from flowrl.core.choices import one_of
from flowrl.core.registry import register
from flowrl.core.types import Conditioning


class FluxAdapter(PipelineAdapter):
    """Shared FLUX plumbing; subclasses say where the pipeline comes from (:meth:`load_pipeline`)."""

    frozen = ("text_encoder", "text_encoder_2", "vae")

    def __init__(self, config: Any) -> None:
        self._text_ids: Tensor | None = None
        super().__init__(config)
        h = self.latent_grid()
        self._img_ids = self.pipe._prepare_latent_image_ids(1, h, h, self.device, torch.float32)

    def vocabulary(self) -> Any:
        return getattr(self.pipe, "tokenizer_2", None)  # T5's: the one FLUX attends to

    # -- geometry --------------------------------------------------------------------------------
    @property
    def pixel_space(self) -> bool:
        return self.pipe.vae is None

    @property
    def patch(self) -> int:
        """Pixels per token side in pixel space (FLUX packs 2x2 latent pixels per token otherwise)."""
        return int(math.isqrt(self.pipe.transformer.config.in_channels // 3)) if self.pixel_space else 2

    def latent_grid(self) -> int:
        """Tokens per side."""
        res = self.config.resolution
        if self.pixel_space:
            return res // self.patch
        return res // (self.pipe.vae_scale_factor * 2)

    @property
    def latent_shape(self) -> tuple[int, int]:
        return (self.latent_grid() ** 2, self.pipe.transformer.config.in_channels)

    # -- Backbone interface --------------------------------------------------------------------------
    def to(self, device: torch.device) -> Self:
        super().to(device)
        self._img_ids = self._img_ids.to(self.device)
        return self

    def encode_rows(self, prompts: list[str]) -> list[tuple[Tensor, Tensor]]:
        """Each prompt's T5 states and CLIP's pooled vector."""
        with torch.no_grad():
            embeds, pooled, text_ids = self.pipe.encode_prompt(
                prompt=prompts,
                prompt_2=None,
                device=self.device,
                max_sequence_length=self.config.max_sequence_length,
            )
        self._text_ids = text_ids
        return list(zip(embeds.float(), pooled.float(), strict=True))

    def encode(self, prompts: list[str]) -> Conditioning:
        rows = self.cached_rows(prompts)
        return Conditioning({"embeds": torch.stack([r[0] for r in rows]), "pooled": torch.stack([r[1] for r in rows])})

    def velocity(self, x: Tensor, s: Tensor, cond: Conditioning) -> Tensor:
        self.nfe += int(x.shape[0])
        return self.flux_forward(x, self._img_ids, s, cond)

    def flux_forward(self, tokens: Tensor, img_ids: Tensor, s: Tensor, cond: Conditioning) -> Tensor:
        """One transformer call on image ``tokens`` at positions ``img_ids`` (not counted in ``nfe``): the text,
        pooled vector and embedded guidance from ``cond`` and the config."""
        guidance = None
        if self.pipe.transformer.config.guidance_embeds:
            guidance = torch.full((tokens.shape[0],), self.config.guidance, device=tokens.device, dtype=torch.float32)
        return self.forward(
            hidden_states=tokens.to(self.dtype),
            timestep=s.to(self.dtype),
            guidance=guidance,
            pooled_projections=cond.tensors["pooled"].to(self.dtype),
            encoder_hidden_states=cond.tensors["embeds"].to(self.dtype),
            txt_ids=self._text_ids,
            img_ids=img_ids,
        )

    def attention_entropy(self, x: Tensor, s: Tensor, cond: Conditioning, options: Any) -> Tensor:
        """Softmax entropy of image-query attention rows ``(B,)``: one probed forward, counted in ``nfe``.

        ``options`` is an :class:`~flowrl.backbones.common.probe_options.AttentionEntropyOptions` (None: defaults).
        """
        return self.velocity_and_entropy(x, s, cond, options)[1]

    def velocity_and_entropy(self, x: Tensor, s: Tensor, cond: Conditioning, options: Any) -> tuple[Tensor, Tensor]:
        """One probed forward gives both (counted once in ``nfe``)."""
        from flowrl.backbones.flux.probe import entropy_probe

        options = options or AttentionEntropyOptions()
        text_len = int(cond.tensors["embeds"].shape[1])
        with torch.no_grad(), entropy_probe(self.module, options, text_len, self.probed_rows(x, cond)) as recorder:
            v = self.velocity(x, s, cond)
        return v, recorder.entropy()

    def probed_rows(self, x: Tensor, cond: Conditioning) -> int | None:
        """The image-query rows the probe measures after the text: None, every image row of the sequence."""
        return None

    def decode(self, x: Tensor) -> Tensor:
        with torch.no_grad():
            if self.pixel_space:
                image = unpack_pixels(x.float(), self.config.resolution, self.patch)
            else:
                vae = self.pipe.vae
                res = self.config.resolution
                latents = self.pipe._unpack_latents(x, res, res, self.pipe.vae_scale_factor)
                latents = latents / vae.config.scaling_factor + vae.config.shift_factor
                image = vae.decode(latents.to(vae.dtype), return_dict=False)[0]
        return unit_images(image)

    def encode_images(self, images: Tensor) -> Tensor:
        """Clean latents ``x0`` for images in [0, 1] (pixel space only: used by pre-training)."""
        if not self.pixel_space:
            raise NotImplementedError("encoding images is only supported in pixel space")
        return pack_pixels(images.float() * 2 - 1, self.patch)


def pack_pixels(images: Tensor, patch: int) -> Tensor:
    """``(B, 3, H, W)`` to ``(B, (H/p)(W/p), 3 p p)`` tokens, channel order (c, dy, dx)."""
    b, c, h, w = images.shape
    x = images.reshape(b, c, h // patch, patch, w // patch, patch)
    return x.permute(0, 2, 4, 1, 3, 5).reshape(b, (h // patch) * (w // patch), c * patch * patch)


def unpack_pixels(tokens: Tensor, resolution: int, patch: int) -> Tensor:
    """Inverse of :func:`pack_pixels`."""
    b, _, ch = tokens.shape
    g = resolution // patch
    x = tokens.reshape(b, g, g, ch // (patch * patch), patch, patch)
    return x.permute(0, 3, 1, 4, 2, 5).reshape(b, ch // (patch * patch), resolution, resolution)


@register("backbone", "flux")
class FluxFromPretrained(FluxAdapter):
    """FLUX.1 (dev, schnell) or any saved FluxPipeline, from a local folder or a hub id (offline respected)."""

    @attrs.frozen
    class Config:
        path: str = attrs.field(validator=attrs.validators.min_len(1))  # folder of save_pretrained, or hub id
        resolution: int = attrs.field(default=512, validator=gt(0))  # image side in pixels
        guidance: float = attrs.field(default=3.5, validator=ge(0))  # embedded guidance (dev); ignored by schnell
        max_sequence_length: int = attrs.field(default=512, validator=gt(0))
        dtype: DType = attrs.field(default="bfloat16", validator=one_of(DType))

    @staticmethod
    def transformer_on_meta(config: Any) -> Any:
        """The saved transformer without weights, when its config is on this machine (module_names)."""
        from flowrl.backbones.lora.targets import saved_transformer

        return saved_transformer(config.path) if config.path else None

    def load_pipeline(self) -> Any:
        from diffusers import FluxPipeline

        path = self.config.path
        kwargs: dict[str, Any] = {}
        index = Path(path) / "model_index.json"
        if index.exists() and json.loads(index.read_text()).get("vae") in (None, [None, None]):
            kwargs["vae"] = None  # a pixel-space pipeline (diffusers needs vae=None said explicitly)
        return load_from_pretrained(FluxPipeline, path, DTYPES[self.config.dtype], **kwargs)
