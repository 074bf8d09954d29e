"""Attention-entropy probe for diffusers' FLUX.2 transformer (AEGPO's measure, as for FLUX.1 in
:mod:`flowrl.backbones.flux.probe`).

FLUX.2 has two attention processors: ``Flux2AttnProcessor`` in the double-stream blocks (separate q/k/v and
added text projections, like FLUX.1's) and ``Flux2ParallelSelfAttnProcessor`` in the single-stream blocks (one
fused ``to_qkv_mlp_proj`` producing q, k, v and the MLP input; one fused ``to_out`` for attention and MLP). A
probe pass swaps the chosen layers' processors for the subclasses below: each computes its output exactly as
the original (same fused attention kernel, so the velocity is unchanged) and, on the side, the softmax entropy
of image-query rows with flowrl's chunked fp32 softmax (:func:`~flowrl.backbones.common.probe.softmax_entropy`).

The processors mirror diffusers 0.42's ``__call__`` bodies and use its private ``_get_qkv_projections``;
``tests/test_flux2.py`` checks that a probed forward gives the unprobed velocity.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.embeddings import apply_rotary_emb
from diffusers.models.transformers.transformer_flux2 import (
    Flux2AttnProcessor,
    Flux2ParallelSelfAttnProcessor,
    _get_qkv_projections,
)
from torch import Tensor, nn

from flowrl.backbones.common.probe import EntropyRecorder, ProbeProcessor, block_attentions, probe_processors
from flowrl.backbones.common.probe_options import AttentionEntropyOptions


def _attend(proc: Any, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None) -> Tensor:
    out = dispatch_attention_fn(
        query, key, value, attn_mask=mask, backend=proc._attention_backend, parallel_config=proc._parallel_config
    )
    return out.flatten(2, 3).to(query.dtype)  # type: ignore[no-any-return]


class DoubleStreamProbe(ProbeProcessor, Flux2AttnProcessor):
    """``Flux2AttnProcessor`` that also records the entropy of image-query rows (text comes first)."""

    def __call__(  # noqa: D102
        self,
        attn: Any,
        hidden_states: Tensor,
        encoder_hidden_states: Tensor | None = None,
        attention_mask: Tensor | None = None,
        image_rotary_emb: Any = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        query, key, value, e_query, e_key, e_value = _get_qkv_projections(attn, hidden_states, encoder_hidden_states)
        query = attn.norm_q(query.unflatten(-1, (-1, attn.head_dim)))
        key = attn.norm_k(key.unflatten(-1, (-1, attn.head_dim)))
        value = value.unflatten(-1, (-1, attn.head_dim))
        if attn.added_kv_proj_dim is not None:
            query = torch.cat([attn.norm_added_q(e_query.unflatten(-1, (-1, attn.head_dim))), query], dim=1)
            key = torch.cat([attn.norm_added_k(e_key.unflatten(-1, (-1, attn.head_dim))), key], dim=1)
            value = torch.cat([e_value.unflatten(-1, (-1, attn.head_dim)), value], dim=1)
        if image_rotary_emb is not None:
            query = apply_rotary_emb(query, image_rotary_emb, sequence_dim=1)
            key = apply_rotary_emb(key, image_rotary_emb, sequence_dim=1)
        self._record(query, key, attention_mask)
        out = _attend(self, query, key, value, attention_mask)
        if encoder_hidden_states is None:
            return attn.to_out[1](attn.to_out[0](out))  # type: ignore[no-any-return]
        text = encoder_hidden_states.shape[1]
        encoder_out, out = out.split_with_sizes([text, out.shape[1] - text], dim=1)
        return attn.to_out[1](attn.to_out[0](out)), attn.to_add_out(encoder_out)


class SingleStreamProbe(ProbeProcessor, Flux2ParallelSelfAttnProcessor):
    """``Flux2ParallelSelfAttnProcessor`` (fused qkv + MLP) that also records the image-query entropy."""

    def __call__(  # noqa: D102
        self,
        attn: Any,
        hidden_states: Tensor,
        attention_mask: Tensor | None = None,
        image_rotary_emb: Any = None,
    ) -> Tensor:
        fused = attn.to_qkv_mlp_proj(hidden_states)
        qkv_dim = 3 * attn.inner_dim
        mlp_dim = attn.mlp_hidden_dim * attn.mlp_mult_factor
        local_qkv = fused.shape[-1] * qkv_dim // (qkv_dim + mlp_dim)
        qkv, mlp = torch.split(fused, [local_qkv, fused.shape[-1] - local_qkv], dim=-1)
        query, key, value = (p.unflatten(-1, (-1, attn.head_dim)) for p in qkv.chunk(3, dim=-1))
        query, key = attn.norm_q(query), attn.norm_k(key)
        if image_rotary_emb is not None:
            query = apply_rotary_emb(query, image_rotary_emb, sequence_dim=1)
            key = apply_rotary_emb(key, image_rotary_emb, sequence_dim=1)
        self._record(query, key, attention_mask)
        out = _attend(self, query, key, value, attention_mask)
        return attn.to_out(torch.cat([out, attn.mlp_act_fn(mlp)], dim=-1))  # type: ignore[no-any-return]


PROBES: dict[type, type[ProbeProcessor]] = {
    Flux2AttnProcessor: DoubleStreamProbe,
    Flux2ParallelSelfAttnProcessor: SingleStreamProbe,
}


def attention_modules(transformer: nn.Module) -> list[Any]:
    """Every attention module in probe order: double-stream blocks, then single-stream blocks."""
    return block_attentions(transformer, ("transformer_blocks", "single_transformer_blocks"), "FLUX.2")


def entropy_probe(
    transformer: nn.Module, options: AttentionEntropyOptions, text_len: int
) -> AbstractContextManager[EntropyRecorder]:
    """Install probe processors on the chosen layers (in place of the :data:`PROBES` classes themselves); restore
    the originals on exit (also on error)."""
    return probe_processors(transformer, attention_modules, options, PROBES, text_len=text_len)
