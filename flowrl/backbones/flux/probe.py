"""Attention-entropy probe for diffusers' FLUX transformer (AEGPO, arXiv 2602.06825).

Fused attention never materialises the softmax, so a probe pass swaps the attention processors of the
chosen layers for :class:`EntropyProbeProcessor`: it computes the attention output exactly as diffusers'
``FluxAttnProcessor`` does (same fused kernel, so the output is unchanged) and, on the side, the softmax
of image-query rows over keys with an explicit, chunked fp32 softmax under ``no_grad``, keeping only
their entropy ``H = -sum_k p_k log p_k``.

The processor mirrors ``FluxAttnProcessor.__call__`` of diffusers 0.42 and uses two private helpers
(``_get_qkv_projections``, ``apply_rotary_emb``); ``tests/test_attention_probe.py`` pins them.
Only :class:`~flowrl.backbones.flux.adapter.FluxAdapter` calls into this module (the probe never imports its
adapter); algorithms see the capability ``flowrl.core.interfaces.AttentionEntropyProbe``.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.embeddings import apply_rotary_emb
from diffusers.models.transformers.transformer_flux import FluxAttnProcessor, _get_qkv_projections
from torch import Tensor, nn

from flowrl.backbones.common.probe import EntropyRecorder, ProbeProcessor, block_attentions, probe_processors
from flowrl.backbones.common.probe_options import AttentionEntropyOptions


class EntropyProbeProcessor(ProbeProcessor, FluxAttnProcessor):
    """``FluxAttnProcessor`` that also records the softmax entropy of image-query rows.

    ``text_len`` is the number of text tokens at the start of the joint sequence: double-stream blocks
    see it as ``encoder_hidden_states``; single-stream blocks get one ``[text; image]`` sequence and are
    told the length here.
    """

    def __call__(  # noqa: D102
        self,
        attn: Any,
        hidden_states: Tensor,
        encoder_hidden_states: Tensor | None = None,
        attention_mask: Tensor | None = None,
        image_rotary_emb: Tensor | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        query, key, value, encoder_query, encoder_key, encoder_value = _get_qkv_projections(
            attn, hidden_states, encoder_hidden_states
        )
        query = attn.norm_q(query.unflatten(-1, (-1, attn.head_dim)))
        key = attn.norm_k(key.unflatten(-1, (-1, attn.head_dim)))
        value = value.unflatten(-1, (-1, attn.head_dim))
        if attn.added_kv_proj_dim is not None:
            encoder_query = attn.norm_added_q(encoder_query.unflatten(-1, (-1, attn.head_dim)))
            encoder_key = attn.norm_added_k(encoder_key.unflatten(-1, (-1, attn.head_dim)))
            encoder_value = encoder_value.unflatten(-1, (-1, attn.head_dim))
            query = torch.cat([encoder_query, query], dim=1)
            key = torch.cat([encoder_key, key], dim=1)
            value = torch.cat([encoder_value, value], dim=1)
        if image_rotary_emb is not None:
            query = apply_rotary_emb(query, image_rotary_emb, sequence_dim=1)
            key = apply_rotary_emb(key, image_rotary_emb, sequence_dim=1)
        self._record(query, key, attention_mask)
        out = dispatch_attention_fn(
            query,
            key,
            value,
            attn_mask=attention_mask,
            backend=self._attention_backend,
            parallel_config=self._parallel_config,
        )
        out = out.flatten(2, 3).to(query.dtype)
        if encoder_hidden_states is not None:
            text = encoder_hidden_states.shape[1]
            encoder_out, out = out.split_with_sizes([text, out.shape[1] - text], dim=1)
            out = attn.to_out[1](attn.to_out[0](out.contiguous()))
            return out, attn.to_add_out(encoder_out.contiguous())
        return out


def attention_modules(transformer: nn.Module) -> list[Any]:
    """Every attention module in probe order: double-stream blocks, then single-stream blocks."""
    return block_attentions(transformer, ("transformer_blocks", "single_transformer_blocks"), "FLUX")


def entropy_probe(
    transformer: nn.Module, options: AttentionEntropyOptions, text_len: int, query_len: int | None = None
) -> AbstractContextManager[EntropyRecorder]:
    """Install probe processors on the chosen layers (in place of ``FluxAttnProcessor`` or a subclass keeping its
    ``__call__``); restore the originals on exit (also on error). ``query_len``: the image rows measured (the
    target's, before an edit source's tokens); None: every image row."""
    probes = {FluxAttnProcessor: EntropyProbeProcessor}
    return probe_processors(
        transformer, attention_modules, options, probes, text_len=text_len, query_len=query_len, subclasses=True
    )
