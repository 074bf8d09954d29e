"""The machinery every attention-entropy probe shares (AEGPO's signal): the chunked fp32 softmax entropy of query
rows over keys, the recorder that collects one entropy per probed layer, the probe processor's common half
(where it records, what it measures) and the swap of a transformer's attention processors for probing ones
(restored on exit, also on error). Torch only: each base's ``probe.py`` subclasses its diffusers processors on
top of this and names, in :func:`probe_processors`, which processor class each of its probes replaces."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from flowrl.backbones.common.probe_options import AttentionEntropyOptions


def softmax_entropy(
    query: Tensor, key: Tensor, chunk_size: int, normalise: bool, key_mask: Tensor | None = None
) -> Tensor:
    """Mean softmax entropy of each query row over ``key`` (the unmasked keys), per batch row.

    ``query`` ``(B, Q, H, D)``, ``key`` ``(B, K, H, D)`` (diffusers' layout), ``key_mask`` ``(B, K)`` bool
    (None: every key); scale ``1/sqrt(D)`` as in scaled-dot-product attention. Computed in fp32,
    ``chunk_size`` query rows at a time; returns ``(B,)``, the mean over query rows and heads, divided by
    ``log`` of the row's key count when ``normalise`` (0 with one key).
    """
    b, q_len, heads, dim = query.shape
    k = key.float().transpose(1, 2)  # (B, H, K, D)
    keep = None if key_mask is None else key_mask.bool()[:, None, None, :]
    scale = 1.0 / math.sqrt(dim)
    total = torch.zeros(b, dtype=torch.float32, device=query.device)
    # fp32 even inside a bf16/fp16 autocast region (the backbone's forward runs under one)
    with torch.no_grad(), torch.autocast(device_type=query.device.type, enabled=False):
        for start in range(0, q_len, chunk_size):
            q = query[:, start : start + chunk_size].float().transpose(1, 2)  # (B, H, c, D)
            logits = torch.matmul(q, k.transpose(-1, -2)) * scale
            if keep is not None:
                logits = logits.masked_fill(~keep, float("-inf"))
            logp = torch.log_softmax(logits, dim=-1)
            plogp = logp.exp() * logp
            if keep is not None:
                plogp = plogp.masked_fill(~keep, 0.0)  # 0 log 0 = 0 for a masked key
            total += -plogp.sum(-1).sum((1, 2))
    entropy = total / (q_len * heads)
    if normalise and key_mask is None:
        n_keys = key.shape[1]
        entropy = entropy / math.log(n_keys) if n_keys > 1 else torch.zeros_like(entropy)
    elif normalise:
        counts = key_mask.sum(1)  # type: ignore[union-attr]
        logk = torch.log(counts.float())
        entropy = torch.where(counts > 1, entropy / logk.clamp_min(1e-12), torch.zeros_like(entropy))
    return entropy


def block_attentions(transformer: nn.Module, streams: tuple[str, ...], base: str) -> list[Any]:
    """The attention module of every block in the ``streams`` lists of ``transformer``, in that order (probe
    order: layer ``i`` of a probe is the ``i``-th); a ``TypeError`` naming ``base`` when there is none."""
    blocks = [block for stream in streams for block in getattr(transformer, stream, ())]
    if not blocks:
        raise TypeError(f"{type(transformer).__name__} has no {base} transformer blocks to probe")
    return [block.attn for block in blocks]


class EntropyRecorder:
    """Collects one ``(B,)`` entropy per probed layer during a forward pass."""

    def __init__(self) -> None:
        self.values: dict[int, Tensor] = {}

    def add(self, layer: int, value: Tensor) -> None:
        self.values[layer] = value.detach().float()

    def entropy(self) -> Tensor:
        """Mean over the probed layers, per batch row ``(B,)``."""
        if not self.values:
            raise RuntimeError("the attention-entropy probe saw no attention call (was the forward run?)")
        return torch.stack([self.values[k] for k in sorted(self.values)]).mean(0)


def unwrap(module: nn.Module) -> nn.Module:
    """The transformer inside a distributed wrapper (``DistributedDataParallel.module``), else itself."""
    while isinstance(module, nn.parallel.DistributedDataParallel):
        module = module.module
    return module


@contextmanager
def swapped_processors(
    modules: list[Any], layers: tuple[int, ...], make: Callable[[int, Any], Any]
) -> Iterator[None]:
    """Inside: each chosen attention module (every one when ``layers`` is empty) runs ``make(i, original)``, a
    probe processor that takes over the original's attention backend; the originals are restored on exit (also
    on error). ``make`` raises NotImplementedError for a processor its probe cannot replace; an index past the
    modules is a ValueError."""
    chosen = layers or tuple(range(len(modules)))
    bad = [i for i in chosen if i >= len(modules)]
    if bad:
        raise ValueError(f"attention layers {bad} out of range: the transformer has {len(modules)} attention modules")
    originals = {i: modules[i].processor for i in chosen}
    try:
        for i in chosen:
            old = originals[i]
            probe = make(i, old)
            probe._attention_backend, probe._parallel_config = old._attention_backend, old._parallel_config
            modules[i].set_processor(probe)
        yield
    finally:
        for i, old in originals.items():
            modules[i].set_processor(old)


def refuse(i: int, old: Any, replaced: str) -> NotImplementedError:
    """The error for attention layer ``i`` whose processor ``old`` is not one the probe can replace."""
    return NotImplementedError(f"attention layer {i} uses {type(old).__name__}; the probe replaces only {replaced}")


class ProbeProcessor:
    """The half every probe processor shares, placed before the diffusers processor it subclasses
    (``class P(ProbeProcessor, FluxAttnProcessor)``): the ``recorder`` it adds its ``layer``'s entropy to, the
    ``options`` saying what to measure and, for a joint ``[text; image]`` sequence, ``text_len``, the text tokens
    at its start; ``query_len``, where set, the image rows measured after them (the rest of the sequence, a
    source image's tokens, still serves as keys), else every row after the text."""

    def __init__(
        self,
        recorder: EntropyRecorder,
        layer: int,
        options: AttentionEntropyOptions,
        text_len: int = 0,
        query_len: int | None = None,
    ) -> None:
        super().__init__()
        self.recorder, self.layer, self.options, self.text_len = recorder, layer, options, text_len
        self.query_len = query_len

    def _record(self, query: Tensor, key: Tensor, attention_mask: Tensor | None) -> None:
        """Record the entropy of the image-query rows of a joint ``[text; image]`` sequence (every
        ``query_stride``-th of the ``query_len`` rows after the ``text_len`` text rows) over every key, or the text
        keys only (``keys = "text"``)."""
        if attention_mask is not None:
            raise NotImplementedError("the attention-entropy probe does not support attention masks")
        o, t = self.options, self.text_len
        keys = key[:, :t] if o.keys == "text" else key
        end = None if self.query_len is None else t + self.query_len
        rows = query[:, t : end : o.query_stride]
        self.recorder.add(self.layer, softmax_entropy(rows, keys, o.chunk_size, o.normalise))


@contextmanager
def probe_processors(
    transformer: nn.Module,
    modules: Callable[[nn.Module], list[Any]],
    options: AttentionEntropyOptions,
    probes: Mapping[type, type[ProbeProcessor]],
    *,
    text_len: int = 0,
    query_len: int | None = None,
    recorder: EntropyRecorder | None = None,
    subclasses: bool = False,
) -> Iterator[EntropyRecorder]:
    """Inside: the chosen layers (``options.layers``) of ``modules(transformer)`` (the transformer unwrapped from
    a distributed wrapper) run probe processors recording into ``recorder`` (a new one by default), which is
    yielded; the originals are restored on exit (also on error).

    ``probes`` maps each diffusers processor class a probe replaces to the probe's class; an original whose class
    is not a key is refused (NotImplementedError), and so is, with ``subclasses``, a subclass of a key that
    overrides its ``__call__`` (without ``subclasses``, only the key classes themselves are replaced)."""
    recorder = EntropyRecorder() if recorder is None else recorder
    replaced = " and ".join(original.__name__ for original in probes)

    def make(i: int, old: Any) -> ProbeProcessor:
        found = probes.get(type(old))
        if found is None and subclasses:
            found = next(
                (p for c, p in probes.items() if isinstance(old, c) and type(old).__call__ is c.__call__), None
            )
        if found is None:
            raise refuse(i, old, replaced)
        return found(recorder, i, options, text_len, query_len)

    with swapped_processors(modules(unwrap(transformer)), options.layers, make):
        yield recorder
