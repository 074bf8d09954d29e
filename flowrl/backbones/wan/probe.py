"""Attention-entropy probe for diffusers' Wan transformer (AEGPO, arXiv 2602.06825).

Wan has no joint text-image attention: each block runs self-attention over the video tokens (``attn1``) and
then cross-attention from the video tokens to the prompt's UMT5 states (``attn2``). The probe maps AEGPO's key
choice onto them: ``keys = "all"`` measures the self-attention rows (every video query over every video key,
after the q/k RMS norm and the 3-D rotary embedding), ``keys = "text"`` the cross-attention rows (every video
query over the prompt's tokens, padding included, as the model attends to them).

A probe pass swaps the chosen layers' ``WanAttnProcessor`` for :class:`WanEntropyProbeProcessor`, which lets
the original processor compute the layer's output (so the velocity is unchanged, bit for bit) and, on the
side and without gradient, recomputes the layer's queries and keys to record the softmax entropy
(:func:`flowrl.backbones.common.probe.softmax_entropy`). It uses one private helper of diffusers 0.42
(``transformer_wan._get_qkv_projections``); ``tests/test_wan.py`` pins it. With classifier-free guidance the
entropy is the conditional rows' (the batched ``[uncond; cond]`` forward's second half).

Image-to-video (:mod:`flowrl.backbones.wan.i2v`): Wan 2.1's cross-attention also attends to the first frame's
CLIP states through added K/V; ``keys = "text"`` measures the text part only (the context split as the processor
splits it). ``skip_rows`` leaves the first video query rows unmeasured (Wan 2.2 TI2V's first latent frame, the
image itself); they still serve as keys.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import torch
from diffusers.models.transformers.transformer_wan import WanAttnProcessor, _get_qkv_projections
from torch import Tensor, nn

from flowrl.backbones.common.probe import EntropyRecorder, ProbeProcessor, probe_processors, softmax_entropy
from flowrl.backbones.common.probe_options import AttentionEntropyOptions


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Wan's rotary embedding: each (even, odd) channel pair of ``x`` ``(B, S, H, D)`` turned by the angle whose
    cosine and sine ``cos`` / ``sin`` ``(1, S, 1, D)`` hold (repeated per pair, as WanRotaryPosEmbed stores them)."""
    even, odd = x[..., 0::2].float(), x[..., 1::2].float()
    c, s = cos[..., 0::2], sin[..., 1::2]
    return torch.stack([even * c - odd * s, even * s + odd * c], dim=-1).flatten(-2).type_as(x)


class WanEntropyProbeProcessor(ProbeProcessor, WanAttnProcessor):
    """``WanAttnProcessor`` that also records the softmax entropy of this layer's video-query rows."""

    def __call__(  # noqa: D102
        self,
        attn: Any,
        hidden_states: Tensor,
        encoder_hidden_states: Tensor | None = None,
        attention_mask: Tensor | None = None,
        rotary_emb: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        if attention_mask is not None:
            raise NotImplementedError("the attention-entropy probe does not support attention masks")
        text = encoder_hidden_states
        if attn.add_k_proj is not None and text is not None:  # Wan 2.1 I2V: [image context; 512 text tokens]
            text = text[:, text.shape[1] - 512 :]
        with torch.no_grad():
            query, key, _ = _get_qkv_projections(attn, hidden_states, text)
            query = attn.norm_q(query).unflatten(2, (attn.heads, -1))
            key = attn.norm_k(key).unflatten(2, (attn.heads, -1))
            if rotary_emb is not None:  # self-attention only: cross-attention has no positions
                query, key = rotate(query, *rotary_emb), rotate(key, *rotary_emb)
            o = self.options
            rows = query[:, self.text_len :: o.query_stride]  # text_len: the leading video rows skipped
            entropy = softmax_entropy(rows, key, o.chunk_size, o.normalise)
        self.recorder.add(self.layer, entropy)
        return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask, rotary_emb)


def attention_modules(transformer: nn.Module, keys: str) -> list[Any]:
    """One attention module per block: self-attention (``keys = "all"``) or cross-attention (``"text"``)."""
    blocks = getattr(transformer, "blocks", None)
    if not blocks:
        raise TypeError(f"{type(transformer).__name__} has no Wan transformer blocks to probe")
    return [block.attn2 if keys == "text" else block.attn1 for block in blocks]


def entropy_probe(
    transformer: nn.Module, options: AttentionEntropyOptions, skip_rows: int = 0
) -> AbstractContextManager[EntropyRecorder]:
    """Install probe processors on the chosen layers (in place of ``WanAttnProcessor`` itself), the first
    ``skip_rows`` video query rows not measured; restore the originals on exit (also on error)."""
    probes = {WanAttnProcessor: WanEntropyProbeProcessor}
    return probe_processors(
        transformer, lambda t: attention_modules(t, options.keys), options, probes, text_len=skip_rows
    )
