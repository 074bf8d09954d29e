"""A tiny FLUX pipeline with random weights, built locally (no hub, no download), and the ``tiny_flux`` backbone.

:func:`tiny_flux_pipeline` assembles a complete ``diffusers.FluxPipeline`` from the sizes in a :class:`TinyFluxSpec`:
a ``FluxTransformer2DModel``, a ``CLIPTextModel`` (pooled text vector), a ``T5EncoderModel`` (token embeddings), two
word-level tokenizers from :func:`flowrl.backbones.common.tokenizer.build_word_tokenizer`, a
``FlowMatchEulerDiscreteScheduler`` and either no VAE (pixel space) or a tiny ``AutoencoderKL``. Everything is
float32 and builds in milliseconds; the result saves with ``save_pretrained`` (:func:`save_tiny_flux`) and loads
with ``FluxPipeline.from_pretrained(folder, local_files_only=True)`` (add ``vae=None`` for a pixel-space one), or
with :func:`load_tiny_flux`, which does that itself. diffusers is imported inside the builders: the spec and the
registered twin stay model-free (recipe checks and the pre-training recipe use them).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
from attrs.validators import ge, gt

from flowrl.backbones.common.checks import check_rotary_axes
from flowrl.backbones.common.settings import DType
from flowrl.backbones.common.tiny import save_pipeline, seeded_modules, tiny_clip_config, tiny_t5, tiny_vae
from flowrl.backbones.common.twin import TwinBackbone
from flowrl.backbones.flux.adapter import FluxAdapter
from flowrl.backbones.flux.kontext import FluxKontextAdapter
from flowrl.core.choices import one_of
from flowrl.core.registry import register

# Offsets added to ``seed * 1000`` so each module draws its own random stream.
_SEED_OFFSETS = {"transformer": 0, "text_encoder": 1, "text_encoder_2": 2, "vae": 3}


def _positive(_instance: object, attribute: attrs.Attribute, value: int) -> None:
    if value <= 0:
        raise ValueError(f"{attribute.name} must be positive, got {value}")


@attrs.frozen
class TinyFluxSpec:
    """Sizes of a tiny FLUX pipeline.

    Pixel space (``pixel_space=True``, no VAE): the model sees a 3 x H x W image packed into
    ``(H/patch) * (W/patch)`` tokens of ``3 * patch**2`` channels (the packing is the adapter's job).
    Latent space: a tiny ``AutoencoderKL`` with ``len(vae_block_out_channels) - 1`` halvings and
    ``latent_channels`` channels; FluxPipeline packs 2x2 latent patches, so the transformer has
    ``4 * latent_channels`` input channels and ``(image_size / (2 * vae_scale_factor))**2`` tokens.

    ``joint_attention_dim`` is the T5 encoder's width (``d_model``), ``pooled_projection_dim`` the CLIP
    text encoder's width (FLUX uses CLIP's pooled output unprojected); ``text_hidden`` is the
    feed-forward width of both text encoders, ``text_layers`` their depth.
    """

    image_size: int = attrs.field(default=32, validator=_positive)
    pixel_space: bool = True
    patch: int = attrs.field(default=4, validator=_positive)
    num_layers: int = 2
    num_single_layers: int = 2
    attention_head_dim: int = attrs.field(default=16, validator=_positive)
    num_attention_heads: int = attrs.field(default=2, validator=_positive)
    joint_attention_dim: int = attrs.field(default=32, validator=_positive)
    pooled_projection_dim: int = attrs.field(default=32, validator=_positive)
    text_hidden: int = attrs.field(default=32, validator=_positive)
    text_layers: int = attrs.field(default=2, validator=_positive)
    text_heads: int = attrs.field(default=2, validator=_positive)
    max_length: int = attrs.field(default=16, validator=_positive)
    shift: float = 3.0
    axes_dims_rope: tuple[int, int, int] = attrs.field(default=(4, 6, 6), converter=tuple)
    guidance_embeds: bool = False
    latent_channels: int = attrs.field(default=4, validator=_positive)
    vae_block_out_channels: tuple[int, ...] = attrs.field(default=(8, 16), converter=tuple)

    def __attrs_post_init__(self) -> None:
        check_rotary_axes(self.axes_dims_rope, 3, self.attention_head_dim)
        for name in ("joint_attention_dim", "pooled_projection_dim"):
            if getattr(self, name) % self.text_heads:
                raise ValueError(f"{name} must be divisible by text_heads={self.text_heads}")
        if self.image_size % self.token_grid_factor:
            raise ValueError(f"image_size {self.image_size} must be divisible by {self.token_grid_factor}")

    @property
    def vae_scale_factor(self) -> int:
        """Pixels per latent cell (latent space only)."""
        return 2 ** (len(self.vae_block_out_channels) - 1)

    @property
    def token_grid_factor(self) -> int:
        """Pixels per transformer token along one side."""
        return self.patch if self.pixel_space else 2 * self.vae_scale_factor

    @property
    def in_channels(self) -> int:
        """Channels per transformer token."""
        return 3 * self.patch**2 if self.pixel_space else 4 * self.latent_channels

    @property
    def num_tokens(self) -> int:
        """Image tokens the transformer sees for an ``image_size`` square image."""
        return (self.image_size // self.token_grid_factor) ** 2


def _transformer(spec: TinyFluxSpec) -> Any:
    from diffusers import FluxTransformer2DModel

    return FluxTransformer2DModel(
        patch_size=1,
        in_channels=spec.in_channels,
        num_layers=spec.num_layers,
        num_single_layers=spec.num_single_layers,
        attention_head_dim=spec.attention_head_dim,
        num_attention_heads=spec.num_attention_heads,
        joint_attention_dim=spec.joint_attention_dim,
        pooled_projection_dim=spec.pooled_projection_dim,
        guidance_embeds=spec.guidance_embeds,
        axes_dims_rope=spec.axes_dims_rope,
    )


def tiny_flux_pipeline(spec: TinyFluxSpec, words: Sequence[str] | None = None, seed: int = 0) -> Any:
    """A randomly initialised float32 FluxPipeline of the sizes in ``spec``; deterministic given ``seed``.

    ``words`` is the tokenizers' vocabulary (default :data:`DEFAULT_WORDS`); both tokenizers are the same
    word-level tokenizer with ``model_max_length = spec.max_length``, so call the pipeline with
    ``max_sequence_length <= spec.max_length``.

    Pixel space (``spec.pixel_space``): the pipeline has ``vae=None``. It is a valid FluxPipeline for
    ``encode_prompt``, the scheduler and the transformer (which the flowrl adapter drives on packed
    pixels). ``save_pretrained`` works (it logs "self.vae=None ... cannot be saved" and records
    ``"vae": [null, null]`` in ``model_index.json``), but diffusers 0.42 lists ``vae`` as a required
    component of FluxPipeline, so a plain ``FluxPipeline.from_pretrained(folder)`` raises
    ``ValueError: ... expected [...] but only {...} were passed``. The supported way is to pass the
    component explicitly: ``FluxPipeline.from_pretrained(folder, vae=None, local_files_only=True)``;
    :func:`load_tiny_flux` does that when the folder records no VAE. The pipeline's ``__call__`` is not
    meant for pixel space: without a VAE it assumes a VAE scale factor of 8 and cannot decode.
    """
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline
    from transformers import CLIPTextModel

    from flowrl.backbones.common.tokenizer import DEFAULT_WORDS, build_word_tokenizer

    words = DEFAULT_WORDS if words is None else words
    tokenizer = build_word_tokenizer(words, spec.max_length)
    vocab_size = len(tokenizer)
    builders = {
        "transformer": lambda: _transformer(spec),
        "text_encoder": lambda: CLIPTextModel(tiny_clip_config(spec, spec.pooled_projection_dim, vocab_size)),
        "text_encoder_2": lambda: tiny_t5(spec, vocab_size),
    }
    if not spec.pixel_space:
        builders["vae"] = lambda: tiny_vae(spec)
    modules = seeded_modules(builders, seed, _SEED_OFFSETS)
    return FluxPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(shift=spec.shift, use_dynamic_shifting=False),
        vae=modules.pop("vae", None),
        tokenizer=tokenizer,
        tokenizer_2=build_word_tokenizer(words, spec.max_length),
        **modules,
    )


def save_tiny_flux(spec: TinyFluxSpec, folder: str | Path, words: Sequence[str] | None = None, seed: int = 0) -> Path:
    """Build :func:`tiny_flux_pipeline` and ``save_pretrained`` it (safetensors) into ``folder``."""
    return save_pipeline(tiny_flux_pipeline(spec, words=words, seed=seed), folder)


def load_tiny_flux(folder: str | Path, **kwargs: object) -> Any:
    """``FluxPipeline.from_pretrained(folder, local_files_only=True, **kwargs)``, adding ``vae=None`` when
    the saved pipeline has no VAE (pixel space; see :func:`tiny_flux_pipeline`)."""
    from diffusers import FluxPipeline

    folder = Path(folder)
    index = json.loads((folder / "model_index.json").read_text())
    if index.get("vae", [None, None])[0] is None:
        kwargs.setdefault("vae", None)
    kwargs.setdefault("local_files_only", True)
    return FluxPipeline.from_pretrained(folder, **kwargs)


@register("backbone", "tiny_flux")
class TinyFlux(TwinBackbone, FluxAdapter):
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
        dtype: DType = attrs.field(default="float32", validator=one_of(DType))

    spec_type = TinyFluxSpec
    build_transformer = staticmethod(_transformer)
    build_pipeline = staticmethod(tiny_flux_pipeline)


def tiny_flux_kontext_pipeline(spec: TinyFluxSpec, words: Sequence[str] | None = None, seed: int = 0) -> Any:
    """The modules of :func:`tiny_flux_pipeline` (latent space: Kontext encodes its source with the VAE) in a
    ``diffusers.FluxKontextPipeline``; deterministic given ``seed``."""
    from diffusers import FluxKontextPipeline

    if spec.pixel_space:
        raise ValueError("a tiny FLUX.1-Kontext pipeline is in latent space (pixel_space=False): it needs a VAE")
    flux = tiny_flux_pipeline(spec, words=words, seed=seed)
    return FluxKontextPipeline(**{k: v for k, v in flux.components.items() if k in _KONTEXT_MODULES})


_KONTEXT_MODULES = ("scheduler", "vae", "text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2", "transformer")


@register("backbone", "tiny_flux_kontext")
class TinyFluxKontext(TwinBackbone, FluxKontextAdapter):
    """A tiny random-weight FluxKontextPipeline (real diffusers classes, built locally, no download), in latent
    space with a tiny VAE; one RGB source image per prompt, resized and centre-cropped to ``resolution``."""

    @attrs.frozen
    class Config:
        seed: int = attrs.field(default=0, validator=ge(0))  # weight initialisation seed
        resolution: int = attrs.field(default=32, validator=gt(0))  # image side in pixels (target and source)
        num_layers: int = attrs.field(default=2, validator=ge(0))  # double-stream blocks
        num_single_layers: int = attrs.field(default=2, validator=ge(0))  # single-stream blocks
        attention_head_dim: int = attrs.field(default=16, validator=gt(0))
        num_attention_heads: int = attrs.field(default=2, validator=gt(0))
        axes_dims_rope: tuple[int, int, int] = (4, 6, 6)  # must sum to attention_head_dim
        max_sequence_length: int = attrs.field(default=16, validator=gt(0))  # prompt tokens
        guidance_embeds: bool = True  # FLUX.1-Kontext-dev is guidance-distilled
        guidance: float = 2.5
        dtype: DType = attrs.field(default="float32", validator=one_of(DType))

    spec_type = TinyFluxSpec
    build_transformer = staticmethod(_transformer)
    build_pipeline = staticmethod(tiny_flux_kontext_pipeline)

    @staticmethod
    def spec_fields(config: Any) -> dict[str, Any]:
        return {"pixel_space": False}
