"""What every tiny twin's builder shares: the seeded, float32 construction of a pipeline's modules, the tiny T5,
CLIP and VAE configs several bases reuse, and saving a built pipeline. Model libraries are imported inside the
functions, so a twin's registered class can import this module while ``flowrl validate`` stays model-free."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch


@contextlib.contextmanager
def float32_default() -> Iterator[None]:
    """Build modules in float32 whatever the caller's default dtype (casting a diffusers model afterwards
    with ``.to(dtype)`` logs a warning)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def seeded_modules(builders: Mapping[str, Callable[[], Any]], seed: int, offsets: Mapping[str, int]) -> dict[str, Any]:
    """Each module built in float32, in the order given, after ``torch.manual_seed(seed * 1000 + offsets[name])``
    (so each draws its own random stream and a twin is deterministic given ``seed``), in eval mode."""
    modules: dict[str, Any] = {}
    with float32_default(), torch.no_grad():
        for name, build in builders.items():
            torch.manual_seed(seed * 1000 + offsets[name])
            modules[name] = build().eval()
    return modules


def save_pipeline(pipe: Any, folder: str | Path) -> Path:
    """``save_pretrained`` a built pipeline (safetensors) into ``folder``, made if missing."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    pipe.save_pretrained(folder, safe_serialization=True)
    return folder


def tiny_clip_config(spec: Any, width: int, vocab_size: int) -> Any:
    """A tiny CLIP text config of ``width`` from a spec's text fields (``text_hidden``, ``text_layers``,
    ``text_heads``, ``max_length``); shared by the tiny FLUX and SD3 pipelines."""
    from transformers import CLIPTextConfig

    from flowrl.backbones.common.tokenizer import BOS_ID, EOS_ID, PAD_ID

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


def t5_settings(width: int, spec: Any, vocab_size: int) -> dict[str, Any]:
    """The settings of a tiny T5-family encoder of ``width`` (T5 for FLUX and SD3, UMT5 for Wan) from a spec's
    ``text_hidden``, ``text_layers``, ``text_heads`` and ``max_length``."""
    from flowrl.backbones.common.tokenizer import EOS_ID, PAD_ID

    return dict(
        vocab_size=vocab_size,
        d_model=width,
        d_kv=width // spec.text_heads,
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


def tiny_t5(spec: Any, vocab_size: int) -> Any:
    """A tiny T5 encoder as wide as the spec's ``joint_attention_dim``; shared by the tiny FLUX and SD3 pipelines."""
    from transformers import T5Config, T5EncoderModel

    return T5EncoderModel(T5Config(**t5_settings(spec.joint_attention_dim, spec, vocab_size)))


def kl_vae_settings(spec: Any) -> dict[str, Any]:
    """The settings of a tiny KL autoencoder (diffusers' ``AutoencoderKL`` for FLUX and SD3,
    ``AutoencoderKLFlux2`` for FLUX.2) from a spec's ``vae_block_out_channels``, ``latent_channels`` and
    ``image_size``: one plain down and up block per width, no quant convolutions."""
    n = len(spec.vae_block_out_channels)
    return dict(
        down_block_types=("DownEncoderBlock2D",) * n,
        up_block_types=("UpDecoderBlock2D",) * n,
        block_out_channels=spec.vae_block_out_channels,
        layers_per_block=1,
        latent_channels=spec.latent_channels,
        norm_num_groups=min(4, *spec.vae_block_out_channels),
        sample_size=spec.image_size,
        use_quant_conv=False,
        use_post_quant_conv=False,
    )


def tiny_vae(spec: Any, scaling_factor: float = 1.0, shift_factor: float = 0.0) -> Any:
    """A tiny AutoencoderKL (:func:`kl_vae_settings`) of RGB images; shared by the tiny FLUX and SD3 pipelines
    (``shift_factor`` must not be None: the pipelines' decode adds it)."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3, out_channels=3, scaling_factor=scaling_factor, shift_factor=shift_factor, **kl_vae_settings(spec)
    )
