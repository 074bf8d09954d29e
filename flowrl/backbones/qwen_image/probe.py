"""Attention-entropy probe for diffusers' Qwen-Image transformer (AEGPO, arXiv 2602.06825).

As for FLUX (:mod:`flowrl.backbones.flux.probe`): fused attention never materialises the softmax, so a
probe pass swaps the chosen blocks' processors for :class:`QwenEntropyProbeProcessor`, which computes the
attention output exactly as ``QwenDoubleStreamAttnProcessor2_0`` does (same projections, norms, RoPE and
fused kernel: the velocity is unchanged) and, on the side, the entropy of image-query rows' softmax over
the keys with an explicit, chunked fp32 softmax under ``no_grad``.

Qwen-Image specifics: the joint sequence is ``[text; image]``; padded text tokens (the
``encoder_hidden_states_mask`` of a batch of prompts of different lengths) are no keys, so they are left
out of the softmax and of the ``log K`` normalisation, row by row. With true CFG the probe watches the
conditional forward only (the negative prompt's forward runs unprobed): the entropy is the prompt's.

The processor mirrors ``QwenDoubleStreamAttnProcessor2_0.__call__`` of diffusers 0.42 and uses its module's
``apply_rotary_emb_qwen``; ``tests/test_qwen_image.py`` pins the probed velocity to the unprobed one.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.transformers.transformer_qwenimage import (
    QwenDoubleStreamAttnProcessor2_0,
    apply_rotary_emb_qwen,
)
from torch import Tensor, nn

from flowrl.backbones.common.probe import (
    EntropyRecorder,
    ProbeProcessor,
    block_attentions,
    probe_processors,
    softmax_entropy,
)
from flowrl.backbones.common.probe_options import AttentionEntropyOptions


class QwenEntropyProbeProcessor(ProbeProcessor, QwenDoubleStreamAttnProcessor2_0):
    """``QwenDoubleStreamAttnProcessor2_0`` that also records the softmax entropy of image-query rows."""

    def __call__(  # noqa: D102
        self,
        attn: Any,
        hidden_states: Tensor,
        encoder_hidden_states: Tensor | None = None,
        encoder_hidden_states_mask: Tensor | None = None,
        attention_mask: Tensor | None = None,
        image_rotary_emb: Any = None,
    ) -> tuple[Tensor, Tensor]:
        if encoder_hidden_states is None or attention_mask is not None:
            raise ValueError("the Qwen-Image probe needs the text stream and builds the joint mask itself")
        key_mask = None
        if encoder_hidden_states_mask is not None:
            image_mask = torch.ones(hidden_states.shape[:2], dtype=torch.bool, device=hidden_states.device)
            key_mask = torch.cat([encoder_hidden_states_mask.bool(), image_mask], dim=1)
            attention_mask = key_mask[:, None, None, :]
        seq_txt = encoder_hidden_states.shape[1]
        head_dim = attn.inner_dim // attn.heads

        def heads(t: Tensor) -> Tensor:
            return t.unflatten(-1, (-1, head_dim))

        img_q, img_k, img_v = heads(attn.to_q(hidden_states)), heads(attn.to_k(hidden_states)), heads(
            attn.to_v(hidden_states))  # fmt: skip
        txt_q, txt_k, txt_v = (heads(attn.add_q_proj(encoder_hidden_states)), heads(attn.add_k_proj(
            encoder_hidden_states)), heads(attn.add_v_proj(encoder_hidden_states)))  # fmt: skip
        if attn.norm_q is not None:
            img_q = attn.norm_q(img_q)
        if attn.norm_k is not None:
            img_k = attn.norm_k(img_k)
        if attn.norm_added_q is not None:
            txt_q = attn.norm_added_q(txt_q)
        if attn.norm_added_k is not None:
            txt_k = attn.norm_added_k(txt_k)
        if image_rotary_emb is not None:
            img_freqs, txt_freqs = image_rotary_emb
            img_q = apply_rotary_emb_qwen(img_q, img_freqs, use_real=False)
            img_k = apply_rotary_emb_qwen(img_k, img_freqs, use_real=False)
            txt_q = apply_rotary_emb_qwen(txt_q, txt_freqs, use_real=False)
            txt_k = apply_rotary_emb_qwen(txt_k, txt_freqs, use_real=False)
        query, key = torch.cat([txt_q, img_q], dim=1), torch.cat([txt_k, img_k], dim=1)
        value = torch.cat([txt_v, img_v], dim=1)
        self._record_masked(query, key, key_mask, seq_txt)
        out = dispatch_attention_fn(
            query, key, value, attn_mask=attention_mask, dropout_p=0.0, is_causal=False,
            backend=self._attention_backend, parallel_config=self._parallel_config,
        )  # fmt: skip
        out = out.flatten(2, 3).to(query.dtype)
        txt_out, img_out = out[:, :seq_txt], out[:, seq_txt:]
        img_out = attn.to_out[0](img_out.contiguous())
        if len(attn.to_out) > 1:
            img_out = attn.to_out[1](img_out)
        return img_out, attn.to_add_out(txt_out.contiguous())

    def _record_masked(self, query: Tensor, key: Tensor, key_mask: Tensor | None, seq_txt: int) -> None:
        o = self.options
        end = None if self.query_len is None else seq_txt + self.query_len  # an edit's target rows only
        image_queries = query[:, seq_txt : end : o.query_stride]
        if o.keys == "text":
            key, key_mask = key[:, :seq_txt], (None if key_mask is None else key_mask[:, :seq_txt])
        if key_mask is None:  # every key counts: normalised by the per-row key count, as with padded prompts
            key_mask = torch.ones(key.shape[:2], dtype=torch.bool, device=key.device)
        self.recorder.add(self.layer, softmax_entropy(image_queries, key, o.chunk_size, o.normalise, key_mask))


def attention_modules(transformer: nn.Module) -> list[Any]:
    """The joint attention module of every dual-stream block, in order."""
    return block_attentions(transformer, ("transformer_blocks",), "Qwen-Image")


def entropy_probe(
    transformer: nn.Module, options: AttentionEntropyOptions, recorder: EntropyRecorder, query_len: int | None = None
) -> AbstractContextManager[EntropyRecorder]:
    """Install probe processors recording into ``recorder`` on the chosen layers (in place of
    ``QwenDoubleStreamAttnProcessor2_0`` or a subclass keeping its ``__call__``); restore the originals on exit
    (also on error). ``query_len``: the image rows measured (an edit's target tokens; the source's after them
    remain keys); None: every image row."""
    probes = {QwenDoubleStreamAttnProcessor2_0: QwenEntropyProbeProcessor}
    return probe_processors(
        transformer, attention_modules, options, probes, query_len=query_len, recorder=recorder, subclasses=True
    )
