"""A tiny, randomly initialised FLUX-class backbone built locally: for tests and quick experiments."""

from __future__ import annotations

from typing import Any, Literal

import attrs
from attrs.validators import ge, gt, in_

from flowrl.backbones.checks import spec_problems
from flowrl.backbones.flux import DTYPES, FluxAdapter
from flowrl.registry import register


@register("backbone", "tiny_flux")
class TinyFlux(FluxAdapter):
    """A tiny random-weight FluxPipeline (real diffusers classes, built locally, no download)."""

    @attrs.frozen
    class Config:
        seed: int = attrs.field(default=0, validator=ge(0))  # weight initialisation seed
        pixel_space: bool = True  # no VAE: the transformer sees packed pixels
        resolution: int = attrs.field(default=32, validator=gt(0))  # image side in pixels
        patch: int = attrs.field(default=4, validator=gt(0))  # pixels per token side (pixel space)
        num_layers: int = attrs.field(default=2, validator=ge(0))  # double-stream blocks
        num_single_layers: int = attrs.field(default=2, validator=ge(0))  # single-stream blocks
        attention_head_dim: int = attrs.field(default=16, validator=gt(0))
        num_attention_heads: int = attrs.field(default=2, validator=gt(0))
        axes_dims_rope: tuple[int, int, int] = (4, 6, 6)  # must sum to attention_head_dim
        max_sequence_length: int = attrs.field(default=16, validator=gt(0))  # prompt tokens
        guidance: float = 3.5
        dtype: Literal["float32", "bfloat16", "float16"] = attrs.field(default="float32", validator=in_(tuple(DTYPES)))

    @staticmethod
    def spec(c: Any) -> Any:
        from flowrl.backbones.tiny_spec import TinyFluxSpec

        return TinyFluxSpec(
            image_size=c.resolution,
            pixel_space=c.pixel_space,
            patch=c.patch,
            num_layers=c.num_layers,
            num_single_layers=c.num_single_layers,
            attention_head_dim=c.attention_head_dim,
            num_attention_heads=c.num_attention_heads,
            axes_dims_rope=c.axes_dims_rope,
            max_length=c.max_sequence_length,
        )

    @staticmethod
    def check_config(config: Config) -> list[tuple[str, str]]:
        return spec_problems(TinyFlux.spec, config)

    @staticmethod
    def transformer_on_meta(config: Config) -> Any:
        """The transformer without weights (flowrl.backbones.module_names)."""
        from flowrl.backbones.module_names import on_meta
        from flowrl.backbones.tiny import _transformer

        return on_meta(lambda: _transformer(TinyFlux.spec(config)))

    def load_pipeline(self) -> Any:
        from flowrl.backbones.tiny import tiny_flux_pipeline

        return tiny_flux_pipeline(self.spec(self.config), seed=self.config.seed)
