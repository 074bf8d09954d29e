"""A tiny random-weight Qwen-Image pipeline built locally (no hub, no download), and ``tiny_qwen_image``.

:func:`tiny_qwen_image_pipeline` assembles a complete ``diffusers.QwenImagePipeline`` from small configs: a
``QwenImageTransformer2DModel``, a ``Qwen2_5_VLForConditionalGeneration`` text encoder (two text layers and
a one-block vision tower, which the text path never runs but the class builds), an ``AutoencoderKLQwenImage``
(Qwen-Image's causal 3-D VAE, two spatial halvings), the word-level tokenizer of
:mod:`flowrl.backbones.qwen_image.tokenizer` (it cuts the pipeline's chat template where the pipeline expects)
and a ``FlowMatchEulerDiscreteScheduler`` with Qwen-Image's published scheduler settings (dynamic shift,
exponential time shift, terminal level 0.02), so the tiny twin samples on the same kind of grid. Everything
is float32 and builds in well under a second; it saves with ``save_pretrained`` and loads with
``QwenImagePipeline.from_pretrained(folder, local_files_only=True)`` (the ``qwen_image`` backbone with
``path = folder``).

Widths: the text encoder's hidden size is the transformer's ``joint_attention_dim``; the VAE's ``z_dim``
latent channels are packed 2x2, so the transformer has ``4 z_dim`` input channels and ``z_dim`` output
channels per patch pixel; ``axes_dims_rope`` must sum to ``attention_head_dim``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
from attrs.validators import ge, gt

from flowrl.backbones.common.checks import check_rotary_axes
from flowrl.backbones.common.settings import DType, SigmaGrid
from flowrl.backbones.common.tiny import save_pipeline, seeded_modules
from flowrl.backbones.common.twin import TwinBackbone
from flowrl.backbones.qwen_image.adapter import QwenImageAdapter, config_problems
from flowrl.backbones.qwen_image.edit import QwenImageEditAdapter, edit_problems
from flowrl.core.choices import one_of
from flowrl.core.registry import register

_SEED_OFFSETS = {"transformer": 0, "text_encoder": 1, "vae": 2}
# Qwen/Qwen-Image's scheduler/scheduler_config.json (the values that differ from the class defaults)
QWEN_IMAGE_SCHEDULER = {
    "base_image_seq_len": 256,
    "base_shift": 0.5,
    "max_image_seq_len": 8192,
    "max_shift": 0.9,
    "shift": 1.0,
    "shift_terminal": 0.02,
    "time_shift_type": "exponential",
    "use_dynamic_shifting": True,
}


@attrs.frozen
class TinyQwenImageSpec:
    """Sizes of a tiny Qwen-Image pipeline (the VAE halves the image twice; 2x2 latent patches per token)."""

    image_size: int = attrs.field(default=32, validator=gt(0))
    num_layers: int = attrs.field(default=2, validator=gt(0))
    attention_head_dim: int = attrs.field(default=16, validator=gt(0))
    num_attention_heads: int = attrs.field(default=2, validator=gt(0))
    axes_dims_rope: tuple[int, int, int] = attrs.field(default=(8, 4, 4), converter=tuple)
    text_width: int = attrs.field(default=16, validator=gt(0))  # Qwen2.5-VL hidden size = joint_attention_dim
    text_layers: int = attrs.field(default=2, validator=gt(0))
    text_heads: int = attrs.field(default=2, validator=gt(0))
    latent_channels: int = attrs.field(default=4, validator=gt(0))  # the VAE's z_dim
    vae_base_dim: int = attrs.field(default=8, validator=gt(0))
    zero_cond_t: bool = False  # Qwen-Image-Edit-2511's transformer: source tokens modulated at t = 0 (edit twins)

    def __attrs_post_init__(self) -> None:
        check_rotary_axes(self.axes_dims_rope, 3, self.attention_head_dim)
        head = self.text_width // self.text_heads
        if self.text_width % self.text_heads or head % 4:
            raise ValueError(f"text_width {self.text_width} / text_heads {self.text_heads} must be a multiple of 4")
        if self.image_size % self.token_factor:
            raise ValueError(f"image_size {self.image_size} must be a multiple of {self.token_factor}")

    @property
    def vae_scale_factor(self) -> int:
        return 4  # two spatial halvings (temperal_downsample has two entries)

    @property
    def token_factor(self) -> int:
        """Pixels per transformer token along one side."""
        return 2 * self.vae_scale_factor


def _transformer(spec: TinyQwenImageSpec) -> Any:
    from diffusers import QwenImageTransformer2DModel

    return QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=4 * spec.latent_channels,
        out_channels=spec.latent_channels,
        num_layers=spec.num_layers,
        attention_head_dim=spec.attention_head_dim,
        num_attention_heads=spec.num_attention_heads,
        joint_attention_dim=spec.text_width,
        guidance_embeds=False,
        axes_dims_rope=spec.axes_dims_rope,
        zero_cond_t=spec.zero_cond_t,
    )


def _text_encoder(
    spec: TinyQwenImageSpec, vocab_size: int, vision: dict[str, Any] | None = None, tokens: dict[str, int] | None = None
) -> Any:
    """The tiny Qwen2.5-VL; ``vision`` replaces the (never run) one-block vision tower's config and ``tokens`` the
    vision token ids, for a twin whose processor feeds it images (the edit twin)."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from flowrl.backbones.qwen_image.tokenizer import IM_END_ID, PAD_ID

    # the multimodal RoPE's sections split half a head's width over (time, height, width)
    half = spec.text_width // spec.text_heads // 2
    sections = [half // 4, half // 4, half - 2 * (half // 4)]
    ids = {"bos_token_id": None, "eos_token_id": IM_END_ID, "pad_token_id": PAD_ID}
    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": vocab_size,
            "hidden_size": spec.text_width,
            "intermediate_size": 2 * spec.text_width,
            "num_hidden_layers": spec.text_layers,
            "num_attention_heads": spec.text_heads,
            "num_key_value_heads": spec.text_heads,
            "rope_scaling": {"mrope_section": sections, "rope_type": "default", "type": "default"},
            "rope_theta": 1000000.0,
            **ids,
        },
        vision_config=vision or {"depth": 1, "hidden_size": 8, "intermediate_size": 8, "num_heads": 1,
                                 "out_hidden_size": spec.text_width},
        # by default ids beyond the vocabulary: no text token is ever taken for an image or video placeholder
        **(tokens or {"image_token_id": vocab_size, "video_token_id": vocab_size + 1,
                      "vision_start_token_id": vocab_size + 2, "vision_end_token_id": vocab_size + 3}),
        **ids,
    )  # fmt: skip
    return Qwen2_5_VLForConditionalGeneration(config)


def _vae(spec: TinyQwenImageSpec) -> Any:
    from diffusers import AutoencoderKLQwenImage

    c = spec.latent_channels
    return AutoencoderKLQwenImage(
        base_dim=spec.vae_base_dim,
        z_dim=c,
        dim_mult=[1, 2, 2],
        num_res_blocks=1,
        temperal_downsample=[False, True],
        # not 0 and 1, so that decode's unnormalising is exercised
        latents_mean=[0.1 * (i % 3) - 0.1 for i in range(c)],
        latents_std=[1.0 + 0.25 * (i % 2) for i in range(c)],
    )


def tiny_qwen_image_pipeline(spec: TinyQwenImageSpec, words: Sequence[str] | None = None, seed: int = 0) -> Any:
    """A randomly initialised float32 ``QwenImagePipeline``; deterministic given ``seed``."""
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImagePipeline

    from flowrl.backbones.common.tokenizer import DEFAULT_WORDS
    from flowrl.backbones.qwen_image.tokenizer import build_qwen_word_tokenizer

    tokenizer = build_qwen_word_tokenizer(DEFAULT_WORDS if words is None else words)
    builders = {
        "transformer": lambda: _transformer(spec),
        "text_encoder": lambda: _text_encoder(spec, len(tokenizer)),
        "vae": lambda: _vae(spec),
    }
    modules = seeded_modules(builders, seed, _SEED_OFFSETS)
    return QwenImagePipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**QWEN_IMAGE_SCHEDULER), tokenizer=tokenizer, **modules
    )


def save_tiny_qwen_image(
    spec: TinyQwenImageSpec, folder: str | Path, words: Sequence[str] | None = None, seed: int = 0
) -> Path:
    """Build :func:`tiny_qwen_image_pipeline` and ``save_pretrained`` it (safetensors) into ``folder``."""
    return save_pipeline(tiny_qwen_image_pipeline(spec, words=words, seed=seed), folder)


@register("backbone", "tiny_qwen_image")
class TinyQwenImage(TwinBackbone, QwenImageAdapter):
    """A tiny random-weight QwenImagePipeline (real diffusers and transformers classes, built locally)."""

    @attrs.frozen
    class Config:
        seed: int = attrs.field(default=0, validator=ge(0))  # weight initialisation seed
        resolution: int = attrs.field(default=32, validator=gt(0))  # image side in pixels (multiple of 8)
        num_layers: int = attrs.field(default=2, validator=gt(0))  # dual-stream transformer blocks
        attention_head_dim: int = attrs.field(default=16, validator=gt(0))
        num_attention_heads: int = attrs.field(default=2, validator=gt(0))
        axes_dims_rope: tuple[int, int, int] = (8, 4, 4)  # must sum to attention_head_dim
        max_sequence_length: int = attrs.field(default=32, validator=gt(0))  # prompt tokens after the template
        true_cfg_scale: float = attrs.field(default=4.0, validator=ge(1.0))  # true CFG scale; 1 disables it
        negative_prompt: str = " "  # the negative branch's prompt (encoded once)
        grid: SigmaGrid = attrs.field(default="diffusers", validator=one_of(SigmaGrid))
        dtype: DType = attrs.field(default="float32", validator=one_of(DType))

    spec_type = TinyQwenImageSpec
    build_transformer = staticmethod(_transformer)
    build_pipeline = staticmethod(tiny_qwen_image_pipeline)

    @classmethod
    def check_config(cls, config: Config) -> list[tuple[str, str]]:
        return [*super().check_config(config), *config_problems(config)]


# -- the edit twin ------------------------------------------------------------------------------------
VISION_PATCH, VISION_MERGE = 4, 2  # the tiny vision tower's pixels per patch side, and patches merged per side


def _edit_text_encoder(spec: TinyQwenImageSpec, tokenizer: Any) -> Any:
    """The tiny Qwen2.5-VL with a vision tower that runs: 4-pixel patches merged 2 x 2 (one vision token per
    8 x 8 pixels), one full-attention block, its token ids the tokenizer's."""
    from flowrl.backbones.qwen_image.tokenizer import IMAGE_PAD, VIDEO_PAD, VISION_END, VISION_START

    vision = {"depth": 1, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2, "patch_size": VISION_PATCH,
              "spatial_merge_size": VISION_MERGE, "temporal_patch_size": 2, "window_size": 4 * VISION_PATCH,
              "fullatt_block_indexes": [0], "out_hidden_size": spec.text_width}  # fmt: skip
    names = {"image_token_id": IMAGE_PAD, "video_token_id": VIDEO_PAD, "vision_start_token_id": VISION_START,
             "vision_end_token_id": VISION_END}  # fmt: skip
    tokens = {key: int(tokenizer.convert_tokens_to_ids(token)) for key, token in names.items()}
    return _text_encoder(spec, len(tokenizer), vision=vision, tokens=tokens)


def _processor(tokenizer: Any) -> Any:
    """Qwen2.5-VL's processor (its image half: :mod:`flowrl.backbones.qwen_image.processor`) on the word tokenizer,
    its image processor sized for the tiny vision tower (any
    image of at most 128 x 128 pixels read at its own size, rounded to 8)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from flowrl.backbones.qwen_image.processor import processor_class

    factor = VISION_PATCH * VISION_MERGE
    images = Qwen2VLImageProcessorPil(patch_size=VISION_PATCH, merge_size=VISION_MERGE, temporal_patch_size=2,
                                      min_pixels=factor * factor, max_pixels=128 * 128)  # fmt: skip
    return processor_class()(image_processor=images, tokenizer=tokenizer)


@attrs.frozen
class TinyQwenImageEditSpec(TinyQwenImageSpec):
    """Sizes of a tiny Qwen-Image-Edit pipeline, and its class (``plus``: ``QwenImageEditPlusPipeline``)."""

    plus: bool = False


def tiny_qwen_image_edit_pipeline(spec: TinyQwenImageEditSpec, words: Sequence[str] | None = None, seed: int = 0
                                  ) -> Any:
    """A randomly initialised float32 ``QwenImageEditPipeline`` (``spec.plus``: ``QwenImageEditPlusPipeline``): the
    transformer and VAE of :func:`tiny_qwen_image_pipeline`, a Qwen2.5-VL whose vision tower reads the sources,
    the edit tokenizer (its template prefix cut where the pipelines drop it) and Qwen2.5-VL's processor on it;
    deterministic given ``seed``."""
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImageEditPipeline, QwenImageEditPlusPipeline

    from flowrl.backbones.common.tokenizer import DEFAULT_WORDS
    from flowrl.backbones.qwen_image.tokenizer import build_qwen_word_tokenizer

    tokenizer = build_qwen_word_tokenizer(DEFAULT_WORDS if words is None else words, edit=True)
    builders = {
        "transformer": lambda: _transformer(spec),
        "text_encoder": lambda: _edit_text_encoder(spec, tokenizer),
        "vae": lambda: _vae(spec),
    }
    modules = seeded_modules(builders, seed, _SEED_OFFSETS)
    cls = QwenImageEditPlusPipeline if spec.plus else QwenImageEditPipeline
    return cls(scheduler=FlowMatchEulerDiscreteScheduler(**QWEN_IMAGE_SCHEDULER), tokenizer=tokenizer,
               processor=_processor(tokenizer), **modules)  # fmt: skip


def save_tiny_qwen_image_edit(
    spec: TinyQwenImageEditSpec, folder: str | Path, words: Sequence[str] | None = None, seed: int = 0
) -> Path:
    """Build :func:`tiny_qwen_image_edit_pipeline` and ``save_pretrained`` it into ``folder``, its processor
    recorded as transformers' ``Qwen2VLProcessor`` (as in a published Qwen-Image-Edit folder: any diffusers with
    torchvision loads it; flowrl's ``qwen_image_edit`` loads its image half)."""
    import json

    folder = save_pipeline(tiny_qwen_image_edit_pipeline(spec, words=words, seed=seed), folder)
    for name, key, value in (("model_index.json", "processor", ["transformers", "Qwen2VLProcessor"]),
                             ("processor/processor_config.json", "processor_class", "Qwen2VLProcessor")):
        file = Path(folder) / name
        data = json.loads(file.read_text())
        data[key] = value
        file.write_text(json.dumps(data, indent=2))
    return Path(folder)


@register("backbone", "tiny_qwen_image_edit")
class TinyQwenImageEdit(TwinBackbone, QwenImageEditAdapter):
    """A tiny random-weight QwenImageEditPipeline (``pipeline = "edit_plus"``: QwenImageEditPlusPipeline), real
    diffusers and transformers classes built locally; ``images`` RGB sources per prompt, each resized and
    centre-cropped to ``resolution``."""

    @attrs.frozen
    class Config:
        seed: int = attrs.field(default=0, validator=ge(0))  # weight initialisation seed
        pipeline: str = attrs.field(default="edit", validator=attrs.validators.in_(("edit", "edit_plus")))
        images: int = attrs.field(default=1, validator=gt(0))  # source images per prompt (edit: 1)
        resolution: int = attrs.field(default=32, validator=gt(0))  # image side in pixels (multiple of 8)
        vision_resolution: int = attrs.field(default=0, validator=ge(0))  # vision encoder's side; 0: the pipeline's
        num_layers: int = attrs.field(default=2, validator=gt(0))  # dual-stream transformer blocks
        attention_head_dim: int = attrs.field(default=16, validator=gt(0))
        num_attention_heads: int = attrs.field(default=2, validator=gt(0))
        axes_dims_rope: tuple[int, int, int] = (8, 4, 4)  # must sum to attention_head_dim
        zero_cond_t: bool = False  # Qwen-Image-Edit-2511's transformer: the sources modulated at t = 0
        max_sequence_length: int = attrs.field(default=32, validator=gt(0))  # instruction tokens kept
        true_cfg_scale: float = attrs.field(default=4.0, validator=ge(1.0))  # true CFG scale; 1 disables it
        negative_prompt: str = " "  # the negative branch's prompt (read with the prompt's sources)
        grid: SigmaGrid = attrs.field(default="diffusers", validator=one_of(SigmaGrid))
        dtype: DType = attrs.field(default="float32", validator=one_of(DType))

    spec_type = TinyQwenImageEditSpec
    build_transformer = staticmethod(_transformer)
    build_pipeline = staticmethod(tiny_qwen_image_edit_pipeline)

    @staticmethod
    def spec_fields(config: Any) -> dict[str, Any]:
        return {"plus": config.pipeline == "edit_plus"}

    @classmethod
    def check_config(cls, config: Config) -> list[tuple[str, str]]:
        return [*super().check_config(config), *edit_problems(config)]
