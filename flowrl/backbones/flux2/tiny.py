"""A tiny random-weight FLUX.2 pipeline built locally (no hub, no download), and the ``tiny_flux2`` backbone.

:func:`tiny_flux2_pipeline` assembles a complete diffusers pipeline of either FLUX.2 class from small configs:

- ``variant = "klein"``: ``Flux2KleinPipeline`` with a ``Qwen3ForCausalLM`` text encoder (FLUX.2-klein; with
  ``distilled = False`` it is klein-base, which guides with a second, negative forward);
- ``variant = "dev"``: ``Flux2Pipeline`` with a ``Mistral3ForConditionalGeneration`` text encoder (a tiny Mistral
  language model and a tiny Pixtral vision tower that text-only prompts never run) and a transformer with the
  ``guidance`` embedder (FLUX.2-dev is guidance-distilled: one forward per step).

Both share a ``Flux2Transformer2DModel``, an ``AutoencoderKLFlux2`` whose batch-norm running statistics are set to
random values (so that the pipeline's latent normalisation is exercised, not the identity) and a word-level
tokenizer (:func:`flowrl.backbones.common.tokenizer.build_word_tokenizer`) with a chat template. The template keeps only
the user's text: the real chat templates wrap the prompt in role markers (and, for dev, a long system message)
that a 16-token tiny model could not hold. The dev pipeline's ``tokenizer`` slot normally holds an
``AutoProcessor``; text-only encoding needs only its ``apply_chat_template``, which the tokenizer has.

The text encoder has as many layers as the pipeline's ``text_encoder_out_layers`` default needs (klein stacks
hidden states 9, 18, 27; dev 10, 20, 30), so the pipelines run with their own defaults; it is narrow, so the
prompt embedding (three stacked layers) is ``3 * text_hidden`` wide (the transformer's ``joint_attention_dim``).
Everything is float32 and deterministic for a seed; ``save_pretrained`` folders load with the ``flux2`` backbone.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import attrs
import torch
from attrs.validators import ge, gt

from flowrl.backbones.common.checks import check_rotary_axes
from flowrl.backbones.common.settings import DType, SigmaGrid
from flowrl.backbones.common.tiny import kl_vae_settings, save_pipeline, seeded_modules
from flowrl.backbones.common.twin import TwinBackbone
from flowrl.backbones.flux2.adapter import BASE_TARGETS, Flux2Adapter, single_block_outputs
from flowrl.core.choices import one_of
from flowrl.core.registry import register

_SEED_OFFSETS = {"transformer": 0, "text_encoder": 1, "vae": 2}
# the hidden-state layers each pipeline class stacks by default (its __call__'s text_encoder_out_layers)
Variant = Literal["klein", "dev"]
OUT_LAYERS = {"klein": (9, 18, 27), "dev": (10, 20, 30)}
# keeps the user's text only (see the module docstring); handles plain and typed ({"type": "text"}) content
CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'user' %}{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for c in m['content'] %}{% if c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}"
    "{% endif %} {% endif %}{% endfor %}"
)


def _ints(value: Iterable[int]) -> tuple[int, ...]:
    return tuple(int(v) for v in value)


@attrs.frozen
class TinyFlux2Spec:
    """Sizes of a tiny FLUX.2 pipeline. The VAE halves the image ``len(vae_block_out_channels) - 1`` times; the
    pipeline patchifies its ``latent_channels`` maps 2x2, so a token has ``4 * latent_channels`` channels and
    there are ``(image_size / (2 * vae_scale_factor))**2`` of them."""

    variant: Variant = attrs.field(default="klein", validator=one_of(Variant))
    distilled: bool = False  # klein only: the pipeline's is_distilled (no CFG); dev is always guidance-distilled
    image_size: int = attrs.field(default=32, validator=gt(0))
    num_layers: int = attrs.field(default=1, validator=ge(0))  # double-stream blocks
    num_single_layers: int = attrs.field(default=2, validator=ge(0))  # single-stream blocks
    attention_head_dim: int = attrs.field(default=16, validator=gt(0))
    num_attention_heads: int = attrs.field(default=2, validator=gt(0))
    axes_dims_rope: tuple[int, ...] = attrs.field(default=(4, 4, 4, 4), converter=_ints)  # (t, h, w, l)
    text_hidden: int = attrs.field(default=16, validator=gt(0))  # text encoder width
    text_heads: int = attrs.field(default=2, validator=gt(0))
    max_length: int = attrs.field(default=16, validator=gt(2))  # prompt tokens
    latent_channels: int = attrs.field(default=4, validator=gt(0))
    vae_block_out_channels: tuple[int, ...] = attrs.field(default=(8, 16), converter=_ints)

    def __attrs_post_init__(self) -> None:
        check_rotary_axes(self.axes_dims_rope, 4, self.attention_head_dim, "t, h, w, l")
        if self.text_hidden % self.text_heads or (self.text_hidden // self.text_heads) % 2:
            raise ValueError(f"text_hidden {self.text_hidden} / text_heads {self.text_heads} must be an even width")
        if self.image_size % self.token_grid_factor:
            raise ValueError(f"image_size {self.image_size} must be a multiple of {self.token_grid_factor}")
        if self.distilled and self.variant == "dev":
            raise ValueError("distilled applies to variant 'klein' (dev is guidance-distilled by its embedder)")

    @property
    def vae_scale_factor(self) -> int:
        return 2 ** (len(self.vae_block_out_channels) - 1)

    @property
    def token_grid_factor(self) -> int:
        """Pixels per transformer token along one side (VAE factor x the 2x2 patchify)."""
        return 2 * self.vae_scale_factor

    @property
    def text_layers(self) -> int:
        """Just enough layers for the pipeline's default hidden-state indices."""
        return max(OUT_LAYERS[self.variant])

    @property
    def joint_attention_dim(self) -> int:
        return 3 * self.text_hidden  # three stacked hidden-state layers


def _transformer(spec: TinyFlux2Spec) -> Any:
    from diffusers import Flux2Transformer2DModel

    return Flux2Transformer2DModel(
        patch_size=1,
        in_channels=4 * spec.latent_channels,
        num_layers=spec.num_layers,
        num_single_layers=spec.num_single_layers,
        attention_head_dim=spec.attention_head_dim,
        num_attention_heads=spec.num_attention_heads,
        joint_attention_dim=spec.joint_attention_dim,
        timestep_guidance_channels=32,
        axes_dims_rope=spec.axes_dims_rope,
        guidance_embeds=spec.variant == "dev",
    )


def _vae(spec: TinyFlux2Spec) -> Any:
    from diffusers import AutoencoderKLFlux2

    vae = AutoencoderKLFlux2(**kl_vae_settings(spec))
    # random running statistics (saved with the weights): the pipeline's normalisation is then no identity
    channels = vae.bn.running_mean.shape[0]
    vae.bn.running_mean.copy_(0.3 * torch.randn(channels))
    vae.bn.running_var.copy_(0.5 + torch.rand(channels))
    return vae


def _text_encoder(spec: TinyFlux2Spec, vocab_size: int) -> Any:
    from flowrl.backbones.common.tokenizer import BOS_ID, EOS_ID, PAD_ID

    text = {
        "vocab_size": vocab_size,
        "hidden_size": spec.text_hidden,
        "intermediate_size": 2 * spec.text_hidden,
        "num_hidden_layers": spec.text_layers,
        "num_attention_heads": spec.text_heads,
        "num_key_value_heads": spec.text_heads,
        "head_dim": spec.text_hidden // spec.text_heads,
        "max_position_embeddings": 4 * spec.max_length,
        "pad_token_id": PAD_ID,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
    }
    if spec.variant == "klein":
        from transformers import Qwen3Config, Qwen3ForCausalLM

        return Qwen3ForCausalLM(Qwen3Config(**text, tie_word_embeddings=False))
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration, MistralConfig, PixtralVisionConfig

    vision = PixtralVisionConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, head_dim=8,
        image_size=16, patch_size=8,
    )
    config = Mistral3Config(
        text_config=MistralConfig(**text), vision_config=vision, image_token_index=vocab_size - 1,
        tie_word_embeddings=False,
    )
    return Mistral3ForConditionalGeneration(config)


def tiny_flux2_pipeline(spec: TinyFlux2Spec, words: Sequence[str] | None = None, seed: int = 0) -> Any:
    """A randomly initialised float32 ``Flux2KleinPipeline`` (variant klein) or ``Flux2Pipeline`` (dev);
    deterministic given ``seed``. Call it with ``max_sequence_length <= spec.max_length``."""
    from diffusers import FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline, Flux2Pipeline

    from flowrl.backbones.common.tokenizer import DEFAULT_WORDS, build_word_tokenizer

    tokenizer = build_word_tokenizer(DEFAULT_WORDS if words is None else words, spec.max_length)
    tokenizer.chat_template = CHAT_TEMPLATE
    builders = {
        "transformer": lambda: _transformer(spec),
        "text_encoder": lambda: _text_encoder(spec, len(tokenizer)),
        "vae": lambda: _vae(spec),
    }
    modules = seeded_modules(builders, seed, _SEED_OFFSETS)
    # FLUX.2's scheduler settings: dynamic (mu) shifting, exponential time shift (the released configs)
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True, time_shift_type="exponential")
    if spec.variant == "dev":
        return Flux2Pipeline(scheduler=scheduler, tokenizer=tokenizer, **modules)
    return Flux2KleinPipeline(scheduler=scheduler, tokenizer=tokenizer, is_distilled=spec.distilled, **modules)


def save_tiny_flux2(spec: TinyFlux2Spec, folder: str | Path, words: Sequence[str] | None = None, seed: int = 0) -> Path:
    """Build :func:`tiny_flux2_pipeline` and ``save_pretrained`` it (safetensors) into ``folder``."""
    return save_pipeline(tiny_flux2_pipeline(spec, words=words, seed=seed), folder)


@register("backbone", "tiny_flux2")
class TinyFlux2(TwinBackbone, Flux2Adapter):
    """A tiny random-weight FLUX.2 pipeline (klein, klein-base or dev; real diffusers classes, built locally)."""

    lora_targets = BASE_TARGETS + single_block_outputs(2)  # the default config's two single blocks

    @classmethod
    def default_lora_targets(cls, config: Any) -> tuple[str, ...]:
        """The published list's form, one output projection per single block of this config."""
        return BASE_TARGETS + single_block_outputs(config.num_single_layers)

    @attrs.frozen
    class Config:
        seed: int = attrs.field(default=0, validator=ge(0))  # weight initialisation seed
        variant: Variant = attrs.field(default="klein", validator=one_of(Variant))
        distilled: bool = False  # klein: the pipeline's is_distilled (False: klein-base, CFG with a negative forward)
        resolution: int = attrs.field(default=32, validator=gt(0))  # image side in pixels (multiple of 4)
        num_layers: int = attrs.field(default=1, validator=ge(0))  # double-stream blocks
        num_single_layers: int = attrs.field(default=2, validator=ge(0))  # single-stream blocks
        attention_head_dim: int = attrs.field(default=16, validator=gt(0))
        num_attention_heads: int = attrs.field(default=2, validator=gt(0))
        max_sequence_length: int = attrs.field(default=16, validator=gt(2))  # prompt tokens
        guidance_scale: float = attrs.field(default=4.0, validator=ge(0.0))  # CFG scale (klein-base) or embedded (dev)
        negative_prompt: str = ""  # klein-base's negative branch (the pipeline's is "")
        grid: SigmaGrid = attrs.field(default="diffusers", validator=one_of(SigmaGrid))
        dtype: DType = attrs.field(default="float32", validator=one_of(DType))

    spec_type = TinyFlux2Spec
    build_transformer = staticmethod(_transformer)
    build_pipeline = staticmethod(tiny_flux2_pipeline)

    @staticmethod
    def spec_fields(c: Any) -> dict[str, Any]:
        if c.attention_head_dim % 8:
            raise ValueError(f"attention_head_dim {c.attention_head_dim} must be a multiple of 8 (four even rope axes)")
        quarter = int(c.attention_head_dim) // 4
        # FLUX.2's rotary split: four equal parts of the head (32 each for the real 128-wide heads)
        return {"axes_dims_rope": (quarter, quarter, quarter, quarter)}
