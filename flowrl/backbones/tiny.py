"""Tiny FLUX pipelines with random weights, built locally (no hub, no download).

``tiny_flux_pipeline`` assembles a complete ``diffusers.FluxPipeline`` from small configs: a
``FluxTransformer2DModel``, a ``CLIPTextModel`` (pooled text vector), a ``T5EncoderModel`` (token
embeddings), two word-level tokenizers from :func:`flowrl.backbones.tokenizer.build_word_tokenizer`, a
``FlowMatchEulerDiscreteScheduler`` and either no VAE (pixel space) or a tiny ``AutoencoderKL``.
Everything is float32 and builds in milliseconds; the result saves with ``save_pretrained`` and loads with
``FluxPipeline.from_pretrained(folder, local_files_only=True)`` (add ``vae=None`` for a pixel-space one),
or with :func:`load_tiny_flux`, which does that itself.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

from flowrl.backbones.tiny_spec import TinyFluxSpec
from flowrl.backbones.tokenizer import BOS_ID, DEFAULT_WORDS, EOS_ID, PAD_ID, build_word_tokenizer

# Offsets added to ``seed * 1000`` so each module draws its own random stream.
_SEED_OFFSETS = {"transformer": 0, "text_encoder": 1, "text_encoder_2": 2, "vae": 3}


def _seed(seed: int, module: str) -> None:
    torch.manual_seed(seed * 1000 + _SEED_OFFSETS[module])


@contextlib.contextmanager
def _float32_default() -> Iterator[None]:
    """Build modules in float32 whatever the caller's default dtype (casting a diffusers model afterwards
    with ``.to(dtype)`` logs a warning)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _transformer(spec: TinyFluxSpec) -> FluxTransformer2DModel:
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


def tiny_clip_config(spec: Any, width: int, vocab_size: int) -> CLIPTextConfig:
    """A tiny CLIP text config of ``width`` from a spec's text fields (``text_hidden``, ``text_layers``,
    ``text_heads``, ``max_length``); shared by the tiny FLUX and SD3 pipelines."""
    return CLIPTextConfig(
        vocab_size=vocab_size,
        hidden_size=width,
        intermediate_size=spec.text_hidden,
        projection_dim=width,
        num_hidden_layers=spec.text_layers,
        num_attention_heads=spec.text_heads,
        max_position_embeddings=spec.max_length,
        hidden_act="quick_gelu",
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,  # pooled output = hidden state at the first </s>
    )


def tiny_t5(spec: Any, vocab_size: int) -> T5EncoderModel:
    """A tiny T5 encoder from a spec's text fields (``joint_attention_dim``, ``text_hidden``,
    ``text_layers``, ``text_heads``, ``max_length``); shared by the tiny FLUX and SD3 pipelines."""
    config = T5Config(
        vocab_size=vocab_size,
        d_model=spec.joint_attention_dim,
        d_kv=spec.joint_attention_dim // spec.text_heads,
        d_ff=spec.text_hidden,
        num_layers=spec.text_layers,
        num_heads=spec.text_heads,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=spec.max_length,
        feed_forward_proj="gated-gelu",
        dropout_rate=0.0,
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
        decoder_start_token_id=PAD_ID,
        tie_word_embeddings=False,
    )
    return T5EncoderModel(config)


def tiny_vae(spec: Any, scaling_factor: float = 1.0, shift_factor: float = 0.0) -> AutoencoderKL:
    """A tiny AutoencoderKL from a spec's ``vae_block_out_channels``, ``latent_channels`` and ``image_size``;
    shared by the tiny FLUX and SD3 pipelines (``shift_factor`` must not be None: the pipelines' decode adds
    it)."""
    n = len(spec.vae_block_out_channels)
    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * n,
        up_block_types=("UpDecoderBlock2D",) * n,
        block_out_channels=spec.vae_block_out_channels,
        layers_per_block=1,
        latent_channels=spec.latent_channels,
        norm_num_groups=min(4, *spec.vae_block_out_channels),
        sample_size=spec.image_size,
        scaling_factor=scaling_factor,
        shift_factor=shift_factor,
        use_quant_conv=False,
        use_post_quant_conv=False,
    )


def tiny_flux_pipeline(spec: TinyFluxSpec, words: Sequence[str] | None = None, seed: int = 0) -> FluxPipeline:
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
    words = DEFAULT_WORDS if words is None else words
    tokenizer = build_word_tokenizer(words, spec.max_length)
    vocab_size = len(tokenizer)

    with _float32_default():
        _seed(seed, "transformer")
        transformer = _transformer(spec)
        _seed(seed, "text_encoder")
        text_encoder = CLIPTextModel(tiny_clip_config(spec, spec.pooled_projection_dim, vocab_size))
        _seed(seed, "text_encoder_2")
        text_encoder_2 = tiny_t5(spec, vocab_size)
        vae = None
        if not spec.pixel_space:
            _seed(seed, "vae")
            vae = tiny_vae(spec)

    scheduler = FlowMatchEulerDiscreteScheduler(shift=spec.shift, use_dynamic_shifting=False)
    pipe = FluxPipeline(
        scheduler=scheduler,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        text_encoder_2=text_encoder_2,
        tokenizer_2=build_word_tokenizer(words, spec.max_length),
        transformer=transformer,
    )
    for module in (transformer, text_encoder, text_encoder_2, vae):
        if module is not None:
            module.eval()
    return pipe


def save_tiny_flux(spec: TinyFluxSpec, folder: str | Path, words: Sequence[str] | None = None, seed: int = 0) -> Path:
    """Build :func:`tiny_flux_pipeline` and ``save_pretrained`` it (safetensors) into ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tiny_flux_pipeline(spec, words=words, seed=seed).save_pretrained(folder, safe_serialization=True)
    return folder


def load_tiny_flux(folder: str | Path, **kwargs: object) -> FluxPipeline:
    """``FluxPipeline.from_pretrained(folder, local_files_only=True, **kwargs)``, adding ``vae=None`` when
    the saved pipeline has no VAE (pixel space; see :func:`tiny_flux_pipeline`)."""
    folder = Path(folder)
    index = json.loads((folder / "model_index.json").read_text())
    if index.get("vae", [None, None])[0] is None:
        kwargs.setdefault("vae", None)
    kwargs.setdefault("local_files_only", True)
    return FluxPipeline.from_pretrained(folder, **kwargs)
