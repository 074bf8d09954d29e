"""A tiny random-weight Stable Diffusion 3 pipeline built locally (no hub, no download), and ``tiny_sd3``.

:func:`tiny_sd3_pipeline` assembles a complete ``diffusers.StableDiffusion3Pipeline`` from small configs:
an ``SD3Transformer2DModel`` (SD3.5 layout: RMS q/k norm, dual attention in the first block), two
``CLIPTextModelWithProjection`` (the CLIP-L and CLIP-G slots), a ``T5EncoderModel``, a tiny
``AutoencoderKL`` and three word-level tokenizers from :func:`flowrl.backbones.common.tokenizer.build_word_tokenizer`.
Everything is float32 and builds in milliseconds; it saves with ``save_pretrained`` and loads with
``StableDiffusion3Pipeline.from_pretrained(folder, local_files_only=True)`` (the ``sd3`` backbone with
``path = folder``).

Shapes follow SD3: the prompt embedding is ``[pad(CLIP-L || CLIP-G hidden states) ; T5 states]`` along
the sequence, so the two CLIP widths must sum to at most the T5 width (``joint_attention_dim``); the pooled
vector is ``CLIP-L proj || CLIP-G proj`` (``pooled_projection_dim`` = the sum of the two widths).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
from attrs.validators import ge, gt

from flowrl.backbones.common.settings import DType, SigmaGrid
from flowrl.backbones.common.tiny import save_pipeline, seeded_modules, tiny_clip_config, tiny_t5, tiny_vae
from flowrl.backbones.common.twin import TwinBackbone
from flowrl.backbones.sd3.adapter import SD3Adapter
from flowrl.core.choices import one_of
from flowrl.core.registry import register

_SEED_OFFSETS = {"transformer": 0, "text_encoder": 1, "text_encoder_2": 2, "text_encoder_3": 3, "vae": 4}


@attrs.frozen
class TinySD3Spec:
    """Sizes of a tiny SD3 pipeline (latent space; the VAE halves the image ``len(vae_block_out_channels) - 1``
    times and the transformer cuts the latent into ``2 x 2`` patches)."""

    image_size: int = attrs.field(default=32, validator=gt(0))
    num_layers: int = attrs.field(default=2, validator=gt(0))
    attention_head_dim: int = attrs.field(default=8, validator=gt(0))
    num_attention_heads: int = attrs.field(default=4, validator=gt(0))
    clip_widths: tuple[int, int] = attrs.field(default=(16, 16), converter=tuple)  # CLIP-L, CLIP-G slots
    joint_attention_dim: int = attrs.field(default=32, validator=gt(0))  # T5 width
    text_hidden: int = attrs.field(default=32, validator=gt(0))  # feed-forward width of the text encoders
    text_layers: int = attrs.field(default=2, validator=gt(0))
    text_heads: int = attrs.field(default=2, validator=gt(0))
    max_length: int = attrs.field(default=16, validator=gt(2))  # tokens per prompt (every tokenizer)
    latent_channels: int = attrs.field(default=4, validator=gt(0))
    vae_block_out_channels: tuple[int, ...] = attrs.field(default=(8, 16), converter=tuple)
    pos_embed_max_size: int = attrs.field(default=16, validator=gt(0))  # latent side / 2 must not exceed it
    dual_attention_layers: tuple[int, ...] = attrs.field(default=(0,), converter=tuple)
    qk_norm: str | None = "rms_norm"
    shift: float = 3.0

    def __attrs_post_init__(self) -> None:
        if sum(self.clip_widths) > self.joint_attention_dim:
            raise ValueError(f"clip_widths {self.clip_widths} must sum to at most joint_attention_dim")
        if any(w % self.text_heads for w in (*self.clip_widths, self.joint_attention_dim)):
            raise ValueError(f"text widths must be divisible by text_heads={self.text_heads}")
        factor = self.vae_scale_factor * 2
        if self.image_size % factor or self.image_size // factor > self.pos_embed_max_size:
            raise ValueError(
                f"image_size {self.image_size} must be a multiple of {factor} and at most "
                f"{factor * self.pos_embed_max_size} (pos_embed_max_size)"
            )

    @property
    def vae_scale_factor(self) -> int:
        return 2 ** (len(self.vae_block_out_channels) - 1)


def _clip(width: int, spec: TinySD3Spec, vocab_size: int) -> Any:
    from transformers import CLIPTextModelWithProjection

    return CLIPTextModelWithProjection(tiny_clip_config(spec, width, vocab_size))


def _transformer(spec: TinySD3Spec) -> Any:
    from diffusers import SD3Transformer2DModel

    inner = spec.attention_head_dim * spec.num_attention_heads
    return SD3Transformer2DModel(
        sample_size=spec.image_size // spec.vae_scale_factor,
        patch_size=2,
        in_channels=spec.latent_channels,
        num_layers=spec.num_layers,
        attention_head_dim=spec.attention_head_dim,
        num_attention_heads=spec.num_attention_heads,
        joint_attention_dim=spec.joint_attention_dim,
        caption_projection_dim=inner,
        pooled_projection_dim=sum(spec.clip_widths),
        out_channels=spec.latent_channels,
        pos_embed_max_size=spec.pos_embed_max_size,
        dual_attention_layers=spec.dual_attention_layers,
        qk_norm=spec.qk_norm,
    )


def tiny_sd3_pipeline(spec: TinySD3Spec, words: Sequence[str] | None = None, seed: int = 0) -> Any:
    """A randomly initialised float32 ``StableDiffusion3Pipeline``; deterministic given ``seed``.

    All three tokenizers are the same word-level tokenizer with ``model_max_length = spec.max_length``
    (the pipeline's CLIP length); call it with ``max_sequence_length <= spec.max_length``.
    """
    from diffusers import FlowMatchEulerDiscreteScheduler, StableDiffusion3Pipeline

    from flowrl.backbones.common.tokenizer import DEFAULT_WORDS, build_word_tokenizer

    words = DEFAULT_WORDS if words is None else words
    tokenizers = [build_word_tokenizer(words, spec.max_length) for _ in range(3)]
    vocab = len(tokenizers[0])
    builders = {
        "transformer": lambda: _transformer(spec),
        "text_encoder": lambda: _clip(spec.clip_widths[0], spec, vocab),
        "text_encoder_2": lambda: _clip(spec.clip_widths[1], spec, vocab),
        "text_encoder_3": lambda: tiny_t5(spec, vocab),
        # SD3's scaling and shift, so that decode's unscaling is exercised
        "vae": lambda: tiny_vae(spec, scaling_factor=1.5305, shift_factor=0.0609),
    }
    modules = seeded_modules(builders, seed, _SEED_OFFSETS)
    return StableDiffusion3Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(shift=spec.shift),
        tokenizer=tokenizers[0],
        tokenizer_2=tokenizers[1],
        tokenizer_3=tokenizers[2],
        **modules,
    )


def save_tiny_sd3(spec: TinySD3Spec, folder: str | Path, words: Sequence[str] | None = None, seed: int = 0) -> Path:
    """Build :func:`tiny_sd3_pipeline` and ``save_pretrained`` it (safetensors) into ``folder``."""
    return save_pipeline(tiny_sd3_pipeline(spec, words=words, seed=seed), folder)


@register("backbone", "tiny_sd3")
class TinySD3(TwinBackbone, SD3Adapter):
    """A tiny random-weight StableDiffusion3Pipeline (real diffusers classes, built locally, no download)."""

    @attrs.frozen
    class Config:
        seed: int = attrs.field(default=0, validator=ge(0))  # weight initialisation seed
        resolution: int = attrs.field(default=32, validator=gt(0))  # image side in pixels (multiple of 4)
        num_layers: int = attrs.field(default=2, validator=gt(0))  # joint transformer blocks
        attention_head_dim: int = attrs.field(default=8, validator=gt(0))
        num_attention_heads: int = attrs.field(default=4, validator=gt(0))
        max_sequence_length: int = attrs.field(default=16, validator=gt(2))  # prompt tokens (CLIP and T5)
        guidance_scale: float = attrs.field(default=4.5, validator=ge(1.0))  # CFG scale; 1 disables CFG
        negative_prompt: str = ""  # the unconditional branch's prompt (encoded once)
        grid: SigmaGrid = attrs.field(default="uniform", validator=one_of(SigmaGrid))  # sigma grid
        dtype: DType = attrs.field(default="float32", validator=one_of(DType))

    spec_type = TinySD3Spec
    build_transformer = staticmethod(_transformer)
    build_pipeline = staticmethod(tiny_sd3_pipeline)
