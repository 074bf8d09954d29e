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

import contextlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any, Literal

import attrs
import torch
from attrs.validators import ge, gt, in_
from torch import Tensor, nn

from flowrl.backbones.prompt_cache import cached_encodings
from flowrl.backbones.vocabulary import UnknownWords
from flowrl.interfaces import Backbone
from flowrl.registry import register
from flowrl.types import Conditioning

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def autocast(device: torch.device, dtype: torch.dtype) -> contextlib.AbstractContextManager[Any]:
    """``torch.autocast`` in ``dtype`` on ``device`` for a reduced-precision backbone; nothing for float32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)


def load_from_pretrained(pipeline_cls: Any, path: str, dtype: torch.dtype, **kwargs: Any) -> Any:
    """``pipeline_cls.from_pretrained`` from a local folder (never the hub) or a hub id (the local cache only
    when ``HF_HUB_OFFLINE=1``), every component in ``dtype``; one clear error when it cannot be found."""
    local = Path(path).exists()
    try:
        return pipeline_cls.from_pretrained(path, local_files_only=local, dtype=dtype, **kwargs)
    except OSError as error:
        offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0", "false", "False")
        where = "local folder" if local else "hub id" + (" (HF_HUB_OFFLINE=1: the local cache only)" if offline else "")
        raise OSError(
            f"cannot load {pipeline_cls.__name__} from {where} '{path}': {error}. Point the backbone's `path` at a "
            "folder written by save_pretrained, or download the model into the Hugging Face cache first"
        ) from error


def prepare_pipeline(load: Any, frozen: tuple[str, ...], dtype: torch.dtype) -> Any:
    """Load a pipeline quietly (no progress bars), freeze the modules named in ``frozen`` (text encoders,
    VAE; absent ones are skipped) and put the transformer in ``dtype``. Shared by the FLUX and SD3 adapters."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    diffusers_logging.disable_progress_bar()
    transformers_logging.disable_progress_bar()
    pipe = load()
    pipe.set_progress_bar_config(disable=True)
    for name in frozen:
        module = getattr(pipe, name, None)
        if module is not None:
            module.requires_grad_(False).eval()
    if pipe.transformer.dtype != dtype:
        pipe.transformer.to(dtype)
    return pipe


class FluxAdapter(Backbone):
    """Shared FLUX plumbing; subclasses say where the pipeline comes from (:meth:`load_pipeline`)."""

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.dtype = DTYPES[config.dtype]
        self.pipe = prepare_pipeline(self.load_pipeline, ("text_encoder", "text_encoder_2", "vae"), self.dtype)
        self.module: nn.Module = self.pipe.transformer  # what velocity() calls; the trainer may wrap it (DDP)
        self.device = torch.device("cpu")
        self.nfe = 0
        self.forward_s = 0.0  # wall time inside the transformer's forward
        self._cache: dict[str, tuple[Tensor, Tensor]] = {}
        self._text_ids: Tensor | None = None
        self._unknown = UnknownWords(getattr(self.pipe, "tokenizer_2", None))  # T5's: the one FLUX attends to
        h = self.latent_grid()
        self._img_ids = self.pipe._prepare_latent_image_ids(1, h, h, self.device, torch.float32)

    def load_pipeline(self) -> Any:
        raise NotImplementedError

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
    @property
    def transformer(self) -> nn.Module:
        return self.pipe.transformer  # type: ignore[no-any-return]

    def to(self, device: torch.device) -> FluxAdapter:
        self.device = torch.device(device)
        self.pipe.to(self.device)
        self._img_ids = self._img_ids.to(self.device)
        self._cache.clear()
        return self

    def encode(self, prompts: list[str]) -> Conditioning:
        def encode(missing: list[str]) -> list[tuple[Tensor, Tensor]]:
            with torch.no_grad():
                embeds, pooled, text_ids = self.pipe.encode_prompt(
                    prompt=missing,
                    prompt_2=None,
                    device=self.device,
                    max_sequence_length=self.config.max_sequence_length,
                )
            self._text_ids = text_ids
            return list(zip(embeds.float(), pooled.float(), strict=True))

        rows = cached_encodings(self._cache, self._unknown, prompts, encode)
        return Conditioning({"embeds": torch.stack([r[0] for r in rows]), "pooled": torch.stack([r[1] for r in rows])})

    def velocity(self, x: Tensor, s: Tensor, cond: Conditioning) -> Tensor:
        self.nfe += int(x.shape[0])
        guidance = None
        if self.pipe.transformer.config.guidance_embeds:
            guidance = torch.full((x.shape[0],), self.config.guidance, device=x.device, dtype=torch.float32)
        start = time.perf_counter()
        with autocast(self.device, self.dtype):
            out = self.module(
                hidden_states=x.to(self.dtype),
                timestep=s.to(self.dtype),
                guidance=guidance,
                pooled_projections=cond.tensors["pooled"].to(self.dtype),
                encoder_hidden_states=cond.tensors["embeds"].to(self.dtype),
                txt_ids=self._text_ids,
                img_ids=self._img_ids,
                return_dict=False,
            )[0]
        self.forward_s += time.perf_counter() - start
        return out.float()  # type: ignore[no-any-return]

    def attention_entropy(self, x: Tensor, s: Tensor, cond: Conditioning, options: Any) -> Tensor:
        """Softmax entropy of image-query attention rows ``(B,)``: one probed forward, counted in ``nfe``.

        ``options`` is an :class:`~flowrl.backbones.flux_attention.AttentionEntropyOptions` (None: defaults).
        """
        return self.velocity_and_entropy(x, s, cond, options)[1]

    def velocity_and_entropy(self, x: Tensor, s: Tensor, cond: Conditioning, options: Any) -> tuple[Tensor, Tensor]:
        """One probed forward gives both (counted once in ``nfe``)."""
        from flowrl.backbones.flux_attention import velocity_and_entropy

        return velocity_and_entropy(self, x, s, cond, options)

    def decode(self, x: Tensor) -> Tensor:
        with torch.no_grad():
            if self.pixel_space:
                image = unpack_pixels(x.float(), self.config.resolution, self.patch)
            else:
                vae = self.pipe.vae
                res = self.config.resolution
                latents = self.pipe._unpack_latents(x, res, res, self.pipe.vae_scale_factor)
                latents = latents / vae.config.scaling_factor + vae.config.shift_factor
                image = vae.decode(latents.to(vae.dtype), return_dict=False)[0].float()
        return ((image + 1) / 2).clamp(0, 1)

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
        dtype: Literal["float32", "bfloat16", "float16"] = attrs.field(default="bfloat16", validator=in_(tuple(DTYPES)))

    @staticmethod
    def transformer_on_meta(config: Any) -> Any:
        """The saved transformer without weights, when its config is on this machine (module_names)."""
        from flowrl.backbones.module_names import saved_transformer

        return saved_transformer(config.path) if config.path else None

    def load_pipeline(self) -> Any:
        from diffusers import FluxPipeline

        path = self.config.path
        kwargs: dict[str, Any] = {}
        index = Path(path) / "model_index.json"
        if index.exists() and json.loads(index.read_text()).get("vae") in (None, [None, None]):
            kwargs["vae"] = None  # a pixel-space pipeline (diffusers needs vae=None said explicitly)
        return load_from_pretrained(FluxPipeline, path, DTYPES[self.config.dtype], **kwargs)
