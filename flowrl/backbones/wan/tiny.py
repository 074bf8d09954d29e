"""A tiny random-weight Wan text-to-video pipeline built locally (no hub, no download), and ``tiny_wan``.

:func:`tiny_wan_pipeline` assembles a complete ``diffusers.WanPipeline`` from small configs: a
``WanTransformer3DModel`` (diffusers' own test sizes: 2 heads of 12, RMS q/k norm across heads, patch
``(1, 2, 2)``), a ``UMT5EncoderModel``, a tiny ``AutoencoderKLWan`` (two spatial and two temporal halvings:
a spatial factor of 4, the real temporal factor of 4, and non-trivial ``latents_mean`` / ``latents_std`` so
that decode's un-normalisation is exercised), a ``FlowMatchEulerDiscreteScheduler`` and the word-level
tokenizer of :mod:`flowrl.backbones.common.tokenizer`. Everything is float32 and builds in milliseconds; it saves with
``save_pretrained`` and loads with ``WanPipeline.from_pretrained(folder, local_files_only=True)`` (the ``wan``
backbone with ``path = folder``).

WanPipeline.check_inputs wants height and width multiples of 16 whatever the VAE, so the tiny twin's frames
are too (16 px: a 4 x 4 latent, 2 x 2 tokens per latent frame).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
from attrs.validators import ge, gt

from flowrl.backbones.common.settings import DType, SigmaGrid
from flowrl.backbones.common.tiny import save_pipeline, seeded_modules, t5_settings
from flowrl.backbones.common.twin import TwinBackbone
from flowrl.backbones.wan.adapter import TEMPORAL, WanAdapter, frame_problems
from flowrl.core.choices import one_of
from flowrl.core.registry import register

_SEED_OFFSETS = {"transformer": 0, "text_encoder": 1, "vae": 2}
SPATIAL = 4  # the tiny VAE's spatial factor (two halvings)


@attrs.frozen
class TinyWanSpec:
    """Sizes of a tiny Wan pipeline (``text_dim`` is the UMT5 width; ``max_length`` its tokens per prompt)."""

    height: int = attrs.field(default=16, validator=gt(0))
    width: int = attrs.field(default=16, validator=gt(0))
    num_layers: int = attrs.field(default=2, validator=gt(0))
    attention_head_dim: int = attrs.field(default=12, validator=gt(0))
    num_attention_heads: int = attrs.field(default=2, validator=gt(0))
    ffn_dim: int = attrs.field(default=32, validator=gt(0))
    text_dim: int = attrs.field(default=16, validator=gt(0))
    text_hidden: int = attrs.field(default=32, validator=gt(0))
    text_layers: int = attrs.field(default=2, validator=gt(0))
    text_heads: int = attrs.field(default=2, validator=gt(0))
    max_length: int = attrs.field(default=16, validator=gt(2))
    latent_channels: int = attrs.field(default=4, validator=gt(0))
    vae_base_dim: int = attrs.field(default=4, validator=gt(0))
    rope_max_seq_len: int = attrs.field(default=32, validator=gt(0))
    shift: float = 3.0

    def __attrs_post_init__(self) -> None:
        if self.text_dim % self.text_heads:
            raise ValueError(f"text_dim {self.text_dim} must be divisible by text_heads={self.text_heads}")
        if self.attention_head_dim % 2 or self.attention_head_dim < 6:  # rotary (t, h, w) parts, in pairs
            raise ValueError(f"attention_head_dim {self.attention_head_dim} must be even and at least 6")
        most = SPATIAL * 2 * self.rope_max_seq_len  # the rotary table covers rope_max_seq_len tokens per side
        for name in ("height", "width"):
            side = getattr(self, name)
            if side % 16 or side > most:
                raise ValueError(f"{name} {side} must be a multiple of 16 (WanPipeline's rule) and at most {most}")


def _transformer(spec: TinyWanSpec) -> Any:
    from diffusers import WanTransformer3DModel

    return WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=spec.num_attention_heads,
        attention_head_dim=spec.attention_head_dim,
        in_channels=spec.latent_channels,
        out_channels=spec.latent_channels,
        text_dim=spec.text_dim,
        freq_dim=256,
        ffn_dim=spec.ffn_dim,
        num_layers=spec.num_layers,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=spec.rope_max_seq_len,
    )


def _umt5(spec: TinyWanSpec, vocab_size: int) -> Any:
    from transformers import UMT5Config, UMT5EncoderModel

    return UMT5EncoderModel(UMT5Config(**t5_settings(spec.text_dim, spec, vocab_size)))


def _vae(spec: TinyWanSpec) -> Any:
    from diffusers import AutoencoderKLWan

    c = spec.latent_channels
    return AutoencoderKLWan(
        base_dim=spec.vae_base_dim,
        z_dim=c,
        dim_mult=[1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[True, True],
        latents_mean=[0.1 * (i % 3) - 0.1 for i in range(c)],  # not 0 / 1: decode must undo them
        latents_std=[0.8 + 0.3 * (i % 4) for i in range(c)],
        scale_factor_spatial=SPATIAL,
        scale_factor_temporal=TEMPORAL,
    )


def tiny_wan_pipeline(spec: TinyWanSpec, words: Sequence[str] | None = None, seed: int = 0) -> Any:
    """A randomly initialised float32 ``WanPipeline``; deterministic given ``seed``. Call it with
    ``max_sequence_length <= spec.max_length`` (the tokenizer's ``model_max_length``)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline

    from flowrl.backbones.common.tokenizer import DEFAULT_WORDS, build_word_tokenizer

    tokenizer = build_word_tokenizer(DEFAULT_WORDS if words is None else words, spec.max_length)
    builders = {
        "transformer": lambda: _transformer(spec),
        "text_encoder": lambda: _umt5(spec, len(tokenizer)),
        "vae": lambda: _vae(spec),
    }
    modules = seeded_modules(builders, seed, _SEED_OFFSETS)
    return WanPipeline(tokenizer=tokenizer, scheduler=FlowMatchEulerDiscreteScheduler(shift=spec.shift), **modules)


def save_tiny_wan(spec: TinyWanSpec, folder: str | Path, words: Sequence[str] | None = None, seed: int = 0) -> Path:
    """Build :func:`tiny_wan_pipeline` and ``save_pretrained`` it (safetensors) into ``folder``."""
    return save_pipeline(tiny_wan_pipeline(spec, words=words, seed=seed), folder)


@register("backbone", "tiny_wan")
class TinyWan(TwinBackbone, WanAdapter):
    """A tiny random-weight WanPipeline (real diffusers classes, built locally, no download): video latents
    ``(4, (num_frames - 1) / 4 + 1, H / 4, W / 4)``, CFG with a frozen negative branch."""

    @attrs.frozen
    class Config:
        seed: int = attrs.field(default=0, validator=ge(0))  # weight initialisation seed
        resolution: int = attrs.field(default=16, validator=gt(0))  # frame side in pixels (multiple of 16)
        height: int = attrs.field(default=0, validator=ge(0))  # frame height (0: resolution)
        width: int = attrs.field(default=0, validator=ge(0))  # frame width (0: resolution)
        num_frames: int = attrs.field(default=5, validator=ge(1))  # pixel frames; num_frames - 1 divisible by 4
        num_layers: int = attrs.field(default=2, validator=gt(0))  # transformer blocks
        attention_head_dim: int = attrs.field(default=12, validator=gt(0))  # even, >= 6 (3-D rotary parts)
        num_attention_heads: int = attrs.field(default=2, validator=gt(0))
        max_sequence_length: int = attrs.field(default=16, validator=gt(2))  # UMT5 tokens
        guidance_scale: float = attrs.field(default=4.5, validator=ge(1.0))  # CFG scale; 1 disables CFG
        negative_prompt: str = ""  # the unconditional branch's prompt (encoded once)
        grid: SigmaGrid = attrs.field(default="uniform", validator=one_of(SigmaGrid))  # sigma grid
        dtype: DType = attrs.field(default="float32", validator=one_of(DType))

    spec_type = TinyWanSpec
    build_transformer = staticmethod(_transformer)
    build_pipeline = staticmethod(tiny_wan_pipeline)

    @staticmethod
    def spec_fields(c: Any) -> dict[str, Any]:
        return {"height": c.height or c.resolution, "width": c.width or c.resolution}

    @classmethod
    def check_config(cls, config: Config) -> list[tuple[str, str]]:
        problems = frame_problems(config)
        most = TEMPORAL * (TinyWanSpec().rope_max_seq_len - 1) + 1  # latent frames the rotary table covers
        if config.num_frames > most:
            problems.append(("num_frames", f"num_frames {config.num_frames} must be at most {most} for tiny_wan"))
        for key, message in super().check_config(config):
            if key in ("height", "width") and not getattr(config, key):
                key = "resolution"  # the side came from resolution
            problems.append((key, message))
        return problems
