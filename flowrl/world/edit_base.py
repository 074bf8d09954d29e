"""The world's edit base: the world's tiny FLUX transformer reading the source image's tokens in its sequence.

As FLUX.1 Kontext does, the source image is packed into tokens exactly as a latent is (8 x 8-pixel tokens of the
32 px image, values in [-1, 1]), appended after the target's tokens, and given the target's position ids with the
first axis set to 1 (the same grid, another "frame"); the transformer's output is sliced back to the target's
tokens, so :meth:`WorldEdit.velocity` has the latent's shape and no other part sees the source. The source is packed
once per prompt in ``encode`` and kept in the prompt's ``Conditioning`` row (``"source"``), cached with the text
embedding. A batch without conditions (plain text prompts) runs exactly the text-to-image forward of
:class:`~flowrl.world.components.WorldTiny`, so the same weights give the same text-to-image output bit for bit.

Preparation rule: the source must be RGB; an image of the base's resolution is taken as it is, any other is
scaled so its short side is the resolution (bicubic) and centre-cropped
(:func:`~flowrl.core.conditions.fit_square`). The sequence holds twice the image tokens of the text-to-image base
(32 instead of 16 at 32 px, plus the text's 16).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Self

import attrs
import torch
from attrs.validators import gt
from torch import Tensor

from flowrl.backbones.common.settings import DType
from flowrl.backbones.flux.adapter import pack_pixels
from flowrl.core.choices import one_of
from flowrl.core.conditions import ConditionSpec, conditions_of, fit_square
from flowrl.core.registry import register
from flowrl.core.types import Conditioning
from flowrl.world.components import WorldTiny

EDIT_MODEL = Path(__file__).with_name("base_model_edit")
SOURCE = ConditionSpec(count=(1, 1), modes=("RGB",), meaning=("the source image",))


@register("backbone", "world_edit_tiny")
class WorldEdit(WorldTiny):
    """The embedded world's edit base: the tiny FLUX reading the source image's tokens (Kontext-style).

    The source's tokens are appended to the image sequence and sliced off the output; one RGB source image per
    prompt; plain text prompts run the text-to-image forward unchanged (docs/editing.md)."""

    @attrs.frozen
    class Config:
        path: str = ""  # a saved world pipeline; empty: the shipped edit base, flowrl/world/base_model_edit
        resolution: int = attrs.field(default=32, validator=gt(0))
        guidance: float = 3.5
        max_sequence_length: int = attrs.field(default=16, validator=gt(0))
        dtype: DType = attrs.field(default="float32", validator=one_of(DType))

    @classmethod
    def accepts(cls, config: Any) -> ConditionSpec:
        return SOURCE

    @staticmethod
    def transformer_on_meta(config: Any) -> Any:
        from flowrl.backbones.lora.targets import saved_transformer

        return saved_transformer(config.path or str(EDIT_MODEL))

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self._source_ids = self._img_ids.clone()
        self._source_ids[:, 0] = 1  # the target's grid on another frame

    def load_pipeline(self) -> Any:
        if not self.config.path:
            if not (EDIT_MODEL / "model_index.json").exists():
                raise FileNotFoundError(
                    f"no edit base model at {EDIT_MODEL}; run `flowrl pretrain recipes/pretrain/world_edit.toml` "
                    "or set the backbone's `path` to a saved world pipeline (docs/editing.md)"
                )
            self.config = attrs.evolve(self.config, path=str(EDIT_MODEL))
        return super().load_pipeline()

    def to(self, device: torch.device) -> Self:
        super().to(device)
        self._source_ids = self._source_ids.to(self.device)
        return self

    def encode_rows(self, prompts: list[str]) -> list[Any]:
        """Each prompt's text rows, and its source image's tokens when it has one."""
        out: list[Any] = []
        for prompt, row in zip(prompts, super().encode_rows(prompts), strict=True):
            conditions = conditions_of(prompt)
            if conditions:
                pixels = fit_square(conditions[0], self.config.resolution)[None] * 2 - 1
                out.append((*row, pack_pixels(pixels, self.patch)[0].to(self.device)))
            else:
                out.append(row)
        return out

    def encode(self, prompts: list[str]) -> Conditioning:
        rows = self.cached_rows(prompts)
        tensors = {"embeds": torch.stack([r[0] for r in rows]), "pooled": torch.stack([r[1] for r in rows])}
        with_source = [len(r) == 3 for r in rows]
        if any(with_source):
            if not all(with_source):
                raise ValueError("world_edit_tiny: a batch mixes prompts with and without a source image")
            tensors["source"] = torch.stack([r[2] for r in rows])
        return Conditioning(tensors)

    def velocity(self, x: Tensor, s: Tensor, cond: Conditioning) -> Tensor:
        source = cond.tensors.get("source")
        if source is None:
            return super().velocity(x, s, cond)  # text-to-image: the world's forward, unchanged
        self.nfe += int(x.shape[0])
        guidance = None
        if self.pipe.transformer.config.guidance_embeds:
            guidance = torch.full((x.shape[0],), self.config.guidance, device=x.device, dtype=torch.float32)
        out = self.forward(
            hidden_states=torch.cat([x, source.to(x.device, x.dtype)], dim=1).to(self.dtype),
            timestep=s.to(self.dtype),
            guidance=guidance,
            pooled_projections=cond.tensors["pooled"].to(self.dtype),
            encoder_hidden_states=cond.tensors["embeds"].to(self.dtype),
            txt_ids=self._text_ids,
            img_ids=torch.cat([self._img_ids, self._source_ids]),
        )
        return out[:, : x.shape[1]]
