"""A tiny random-weight Wan image-to-video pipeline built locally (no hub, no download), and ``tiny_wan_i2v``.

:func:`tiny_wan_i2v_pipeline` assembles a complete ``diffusers.WanImageToVideoPipeline`` from small configs, in one
of the three layouts diffusers drives (``variant``):

- ``"2.1"`` (Wan 2.1 I2V): a ``WanTransformer3DModel`` with ``image_dim`` (the CLIP width) and added K/V for the
  image context, ``in_channels = 2 z + 4`` (the noisy latent, the 4-channel first-frame mask, the image latent), a
  tiny ``CLIPVisionModel`` with its ``CLIPImageProcessor`` (32 px), and the text-to-video twin's VAE;
- ``"2.2-a14b"`` (Wan 2.2 I2V-A14B): two such transformers without image context (``transformer`` for the
  high-noise steps, ``transformer_2`` for the low-noise ones, switched at ``boundary_ratio``), no image encoder;
- ``"2.2-ti2v"`` (Wan 2.2 TI2V-5B): one transformer with ``in_channels = z`` and ``expand_timesteps``, and a
  residual VAE that patchifies 2 x 2 pixels first (``is_residual``, ``patch_size = 2``: a spatial factor of 16,
  as the 5B's), ``z = 8`` here (48 in the 5B).

The text side (UMT5, the word-level tokenizer) is the text-to-video twin's. Wan 2.1's transformer splits its
cross-attention context into image and text tokens by assuming 512 text tokens, so that variant's tokenizer pads to
512 (the others to ``max_length``). Everything is float32 and builds in well under a second; it saves with
``save_pretrained`` and loads with ``WanImageToVideoPipeline.from_pretrained`` (the ``wan_i2v`` backbone).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
from attrs.validators import ge, gt, le

from flowrl.backbones.common.settings import DType, SigmaGrid
from flowrl.backbones.common.tiny import save_pipeline, seeded_modules
from flowrl.backbones.common.twin import TwinBackbone
from flowrl.backbones.wan.i2v import VARIANTS, WAN21_TEXT_TOKENS, Expert, Variant, WanI2VAdapter, i2v_frame_problems
from flowrl.backbones.wan.tiny import TinyWanSpec, _umt5, _vae
from flowrl.core.choices import one_of
from flowrl.core.registry import register

_SEED_OFFSETS = {"transformer": 0, "text_encoder": 1, "vae": 2, "image_encoder": 3, "transformer_2": 4}
CLIP_SIZE = 32  # the tiny CLIP's image side (its processor resizes and crops to it)


@attrs.frozen
class TinyWanI2VSpec(TinyWanSpec):
    """Sizes of a tiny Wan image-to-video pipeline: the text-to-video twin's, the layout (``variant``), the CLIP
    width (``image_dim``, 2.1) and the expert boundary (2.2-a14b)."""

    variant: Variant = attrs.field(default="2.1", validator=one_of(VARIANTS))
    image_dim: int = attrs.field(default=8, validator=gt(0))
    boundary_ratio: float = attrs.field(default=0.9, validator=[gt(0.0), le(1.0)])

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        multiple = 32 if self.variant == "2.2-ti2v" else 16  # the VAE's spatial factor x patch 2 (and >= 16)
        for name in ("height", "width"):
            if getattr(self, name) % multiple:
                raise ValueError(f"{name} {getattr(self, name)} must be a multiple of {multiple} for variant "
                                 f"{self.variant} (the VAE's spatial factor x the patch size 2)")

    @property
    def z_dim(self) -> int:
        return 8 if self.variant == "2.2-ti2v" else self.latent_channels

    @property
    def text_length(self) -> int:
        return WAN21_TEXT_TOKENS if self.variant == "2.1" else self.max_length


def _transformer(spec: TinyWanI2VSpec) -> Any:
    from diffusers import WanTransformer3DModel

    concat = spec.variant != "2.2-ti2v"
    return WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=spec.num_attention_heads,
        attention_head_dim=spec.attention_head_dim,
        in_channels=2 * spec.z_dim + 4 if concat else spec.z_dim,  # noise + mask (4 per latent frame) + image latent
        out_channels=spec.z_dim,
        text_dim=spec.text_dim,
        freq_dim=256,
        ffn_dim=spec.ffn_dim,
        num_layers=spec.num_layers,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        image_dim=spec.image_dim if spec.variant == "2.1" else None,
        added_kv_proj_dim=spec.num_attention_heads * spec.attention_head_dim if spec.variant == "2.1" else None,
        rope_max_seq_len=spec.rope_max_seq_len,
    )


def _clip(spec: TinyWanI2VSpec) -> Any:
    from transformers import CLIPVisionConfig, CLIPVisionModel

    return CLIPVisionModel(CLIPVisionConfig(
        hidden_size=spec.image_dim, intermediate_size=2 * spec.image_dim, num_hidden_layers=2, num_attention_heads=2,
        image_size=CLIP_SIZE, patch_size=8, projection_dim=spec.image_dim,
    ))


def _ti2v_vae(spec: TinyWanI2VSpec) -> Any:
    from diffusers import AutoencoderKLWan

    c = spec.z_dim
    return AutoencoderKLWan(
        base_dim=spec.vae_base_dim,
        decoder_base_dim=spec.vae_base_dim,
        z_dim=c,
        in_channels=12,  # 3 colours x the 2 x 2 pixel patch
        out_channels=12,
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
        is_residual=True,
        patch_size=2,
        latents_mean=[0.1 * (i % 3) - 0.1 for i in range(c)],
        latents_std=[0.8 + 0.3 * (i % 4) for i in range(c)],
        scale_factor_spatial=16,
        scale_factor_temporal=4,
    )


def tiny_wan_i2v_pipeline(spec: TinyWanI2VSpec, words: Sequence[str] | None = None, seed: int = 0) -> Any:
    """A randomly initialised float32 ``WanImageToVideoPipeline`` of ``spec.variant``; deterministic given ``seed``."""
    from diffusers import FlowMatchEulerDiscreteScheduler, WanImageToVideoPipeline
    from transformers import CLIPImageProcessor

    from flowrl.backbones.common.tokenizer import DEFAULT_WORDS, build_word_tokenizer

    tokenizer = build_word_tokenizer(DEFAULT_WORDS if words is None else words, spec.text_length)
    builders: dict[str, Any] = {
        "transformer": lambda: _transformer(spec),
        "text_encoder": lambda: _umt5(attrs.evolve(spec, max_length=spec.text_length), len(tokenizer)),
        "vae": lambda: _ti2v_vae(spec) if spec.variant == "2.2-ti2v" else _vae(spec),
    }
    if spec.variant == "2.1":
        builders["image_encoder"] = lambda: _clip(spec)
    if spec.variant == "2.2-a14b":
        builders["transformer_2"] = lambda: _transformer(spec)
    modules = seeded_modules(builders, seed, _SEED_OFFSETS)
    clip = "image_encoder" in modules
    processor = CLIPImageProcessor(size={"shortest_edge": CLIP_SIZE}, crop_size=CLIP_SIZE) if clip else None
    return WanImageToVideoPipeline(
        tokenizer=tokenizer,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=spec.shift),
        image_processor=processor,
        boundary_ratio=spec.boundary_ratio if spec.variant == "2.2-a14b" else None,
        expand_timesteps=spec.variant == "2.2-ti2v",
        **modules,
    )


def save_tiny_wan_i2v(spec: TinyWanI2VSpec, folder: str | Path, words: Sequence[str] | None = None,
                      seed: int = 0) -> Path:
    """Build :func:`tiny_wan_i2v_pipeline` and ``save_pretrained`` it (safetensors) into ``folder``."""
    return save_pipeline(tiny_wan_i2v_pipeline(spec, words=words, seed=seed), folder)


@register("backbone", "tiny_wan_i2v")
class TinyWanI2V(TwinBackbone, WanI2VAdapter):
    """A tiny random-weight WanImageToVideoPipeline (real diffusers classes, built locally, no download) in one of
    Wan's three image-to-video layouts (``variant``: 2.1 with CLIP, 2.2 A14B's two experts, 2.2 TI2V-5B's
    replaced first frame); one RGB first frame per prompt."""

    @attrs.frozen
    class Config:
        seed: int = attrs.field(default=0, validator=ge(0))  # weight initialisation seed
        variant: Variant = attrs.field(default="2.1", validator=one_of(VARIANTS))  # the layout (module docstring)
        resolution: int = attrs.field(default=16, validator=gt(0))  # frame side in pixels
        height: int = attrs.field(default=0, validator=ge(0))  # frame height (0: resolution)
        width: int = attrs.field(default=0, validator=ge(0))  # frame width (0: resolution)
        num_frames: int = attrs.field(default=5, validator=ge(1))  # pixel frames; num_frames - 1 divisible by 4
        num_layers: int = attrs.field(default=2, validator=gt(0))  # transformer blocks (each expert)
        attention_head_dim: int = attrs.field(default=12, validator=gt(0))  # even, >= 6 (3-D rotary parts)
        num_attention_heads: int = attrs.field(default=2, validator=gt(0))
        max_sequence_length: int = attrs.field(default=512, validator=gt(2))  # UMT5 tokens (2.1: must be 512)
        guidance_scale: float = attrs.field(default=4.5, validator=ge(1.0))  # CFG scale (2.2-a14b: high-noise expert)
        guidance_scale_2: float = attrs.field(default=0.0, validator=ge(0.0))  # low-noise expert's; 0: guidance_scale
        boundary_ratio: float = attrs.field(default=0.9, validator=[gt(0.0), le(1.0)])  # 2.2-a14b's expert switch
        expert: Expert = attrs.field(default="high", validator=one_of(Expert))  # 2.2-a14b: the expert trained
        negative_prompt: str = ""  # the unconditional branch's prompt (encoded once)
        grid: SigmaGrid = attrs.field(default="uniform", validator=one_of(SigmaGrid))  # sigma grid
        dtype: DType = attrs.field(default="float32", validator=one_of(DType))

    spec_type = TinyWanI2VSpec
    build_transformer = staticmethod(_transformer)
    build_pipeline = staticmethod(tiny_wan_i2v_pipeline)

    @staticmethod
    def spec_fields(c: Any) -> dict[str, Any]:
        return {"height": c.height or c.resolution, "width": c.width or c.resolution}

    @classmethod
    def check_config(cls, config: Config) -> list[tuple[str, str]]:
        two = config.variant == "2.2-a14b"
        problems = i2v_frame_problems(config, clip=config.variant == "2.1", two_experts=two)
        for key, message in super().check_config(config):
            if key in ("height", "width") and not getattr(config, key):
                key = "resolution"  # the side came from resolution
            problems.append((key, message))
        return problems
