"""The FLUX.1-Kontext edit base: a diffusers ``FluxKontextPipeline`` (FLUX.1-Kontext-dev) behind flowrl's
:class:`Backbone`, as :class:`FluxKontextAdapter`, a :class:`~flowrl.backbones.flux.adapter.FluxAdapter` that
also reads one source image.

How Kontext conditions on the source (diffusers ``FluxKontextPipeline``): the source image is VAE-encoded (the
posterior's mode, no sampling), shifted and scaled as a target latent is (``(z - shift_factor) * scaling_factor``),
packed into 2 x 2 latent-pixel tokens exactly as a latent is, and appended after the noisy target tokens along the
sequence. Its position ids are the target grid's with the first coordinate set to 1 (another "frame" of the same
grid). The transformer's output is cut back to the target's tokens, so :meth:`FluxKontextAdapter.velocity` has the
latent's shape and no other part of flowrl sees the source. The source tokens are clean (never noised) and the
same at every step: they are encoded once per prompt in ``encode`` and kept in the prompt's ``Conditioning`` row
(``"source"``), cached with its text encoding. The sequence holds twice the target's image tokens.

Preparation rule (flowrl's, not the pipeline's): the source must be RGB; an image of the base's ``resolution``
square is taken as it is, any other is scaled so its short side is the resolution (bicubic) and centre-cropped
(:func:`~flowrl.core.conditions.fit_square`), so source and target share one square grid. The pipeline instead
snaps the source to the nearest of its preferred Kontext resolutions by aspect ratio (``_auto_resize``) and makes
a 1024 x 1024-area output; with ``_auto_resize=False`` and ``max_area = resolution**2`` on a source already of the
base's resolution it computes what flowrl does (tests/test_flux_kontext.py holds them equal).

A prompt without a source image runs FLUX.1's text-to-image forward (the pipeline's ``image=None``), so the
conformance checks and text prompts work; a batch mixing both is refused. Only latent space: Kontext needs a VAE.
"""

from __future__ import annotations

from typing import Any, Self

import attrs
import torch
from attrs.validators import ge, gt
from torch import Tensor

from flowrl.backbones.common.checks import packed_vae_multiple, saved_json
from flowrl.backbones.common.pipeline import DTYPES, load_from_pretrained
from flowrl.backbones.common.settings import DType
from flowrl.backbones.flux.adapter import FluxAdapter
from flowrl.core.choices import one_of
from flowrl.core.conditions import ConditionSpec, conditions_of, fit_square
from flowrl.core.registry import register
from flowrl.core.types import Conditioning

SOURCE = ConditionSpec(count=(1, 1), modes=("RGB",), meaning=("the source image",))


class FluxKontextAdapter(FluxAdapter):
    """FLUX.1-Kontext: the FLUX adapter reading the source image's VAE tokens in its sequence (see the module)."""

    @classmethod
    def accepts(cls, config: Any) -> ConditionSpec:
        return SOURCE

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        factor = self.pipe.vae_scale_factor * 2
        if config.resolution % factor:
            raise ValueError(f"resolution {config.resolution} must be a multiple of {factor} for this Kontext model")
        self._source_ids = self._img_ids.clone()
        self._source_ids[:, 0] = 1  # the target's grid on another frame

    def to(self, device: torch.device) -> Self:
        super().to(device)
        self._source_ids = self._source_ids.to(self.device)
        return self

    def source_tokens(self, images: Tensor) -> Tensor:
        """Packed source latents ``(B, tokens, channels)`` (float32) for images ``(B, 3, res, res)`` in [0, 1]."""
        vae = self.pipe.vae
        with torch.no_grad():
            z = vae.encode((images * 2 - 1).to(self.device, vae.dtype)).latent_dist.mode()
            z = (z - vae.config.shift_factor) * vae.config.scaling_factor
        b, c, h, w = z.shape
        return self.pipe._pack_latents(z, b, c, h, w).float()  # type: ignore[no-any-return]

    def encode_rows(self, prompts: list[str]) -> list[Any]:
        """Each prompt's text rows, and its source image's tokens when it has one."""
        out: list[Any] = []
        for prompt, row in zip(prompts, super().encode_rows(prompts), strict=True):
            conditions = conditions_of(prompt)
            if conditions:
                image = fit_square(conditions[0], self.config.resolution)[None]
                out.append((*row, self.source_tokens(image)[0]))
            else:
                out.append(row)
        return out

    def encode(self, prompts: list[str]) -> Conditioning:
        cond = super().encode(prompts)
        rows = self.cached_rows(prompts)
        with_source = [len(r) == 3 for r in rows]
        if any(with_source):
            if not all(with_source):
                raise ValueError(f"{type(self).__name__}: a batch mixes prompts with and without a source image")
            cond.tensors["source"] = torch.stack([r[2] for r in rows])
        return cond

    def velocity(self, x: Tensor, s: Tensor, cond: Conditioning) -> Tensor:
        source = cond.tensors.get("source")
        if source is None:
            return super().velocity(x, s, cond)  # no source: FLUX.1's text-to-image forward
        self.nfe += int(x.shape[0])
        tokens = torch.cat([x, source.to(x.device, x.dtype)], dim=1)
        out = self.flux_forward(tokens, torch.cat([self._img_ids, self._source_ids]), s, cond)
        return out[:, : x.shape[1]]

    def probed_rows(self, x: Tensor, cond: Conditioning) -> int | None:
        """AEGPO's probe measures the target's query rows only (the source's tokens still serve as keys): the
        entropy describes the attention of the tokens being generated, whose transitions are the ones trained;
        the source's rows are clean, the same at every step and outside the log-density, and would be half the
        rows measured."""
        return int(x.shape[1])


@register("backbone", "flux_kontext")
class FluxKontextFromPretrained(FluxKontextAdapter):
    """FLUX.1-Kontext-dev or any saved FluxKontextPipeline, from a local folder or a hub id (offline respected);
    one RGB source image per prompt, resized and centre-cropped to ``resolution`` (docs/editing.md)."""

    @attrs.frozen
    class Config:
        path: str = attrs.field(validator=attrs.validators.min_len(1))  # folder of save_pretrained, or hub id
        resolution: int = attrs.field(default=512, validator=gt(0))  # image side in pixels (target and source)
        guidance: float = attrs.field(default=2.5, validator=ge(0))  # embedded guidance
        max_sequence_length: int = attrs.field(default=512, validator=gt(0))
        dtype: DType = attrs.field(default="bfloat16", validator=one_of(DType))

    @staticmethod
    def check_config(config: Config) -> list[tuple[str, str]]:
        """What the saved model's files on this machine (if any) already refute: the resolution's multiple."""
        vae = saved_json(config.path, "vae/config.json")
        factor = packed_vae_multiple(vae) if vae is not None else None
        if factor is not None and config.resolution % factor:
            return [("resolution", f"{config.resolution} must be a multiple of {factor} for the model in {config.path}"
                     " (the VAE's pixels per latent cell, 2 x 2 cells a token)")]
        return []

    @staticmethod
    def transformer_on_meta(config: Any) -> Any:
        """The saved transformer without weights, when its config is on this machine (module_names)."""
        from flowrl.backbones.lora.targets import saved_transformer

        return saved_transformer(config.path) if config.path else None

    def load_pipeline(self) -> Any:
        from diffusers import FluxKontextPipeline

        return load_from_pretrained(FluxKontextPipeline, self.config.path, DTYPES[self.config.dtype])
