"""The model being pre-trained: a pixel-space tiny FLUX over the world's vocabulary, behind the FLUX adapter.

:func:`build_backbone` makes it from a :class:`~flowrl.pretrain.recipe.ModelConfig`; velocity and decoding
go through :class:`~flowrl.backbones.flux.adapter.FluxAdapter`, the very calls sampling and RL make, so the
convention cannot drift between pre-training and fine-tuning.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from flowrl.backbones.flux.adapter import FluxAdapter
from flowrl.backbones.flux.tiny import tiny_flux_pipeline
from flowrl.pretrain.recipe import ModelConfig, PretrainRecipeError, resolve_folder
from flowrl.world.edit_base import WorldEdit
from flowrl.world.grammar import vocabulary


class _Adapter(FluxAdapter):
    """The FLUX adapter around a pipeline built here (so velocity and decoding match the world_tiny backbone)."""

    def __init__(self, pipe: Any, config: Any) -> None:
        self._fresh = pipe
        super().__init__(config)

    def load_pipeline(self) -> Any:
        return self._fresh


def build_backbone(model: ModelConfig, seed: int, task: str = "text_to_image") -> FluxAdapter:
    """A randomly initialised pixel-space tiny FLUX over the world's vocabulary, behind the FLUX adapter; for the
    ``"edit"`` task, over the instruction vocabulary too, behind the edit base (the source's tokens appended)."""
    from flowrl.world.components import WorldTiny

    spec = model.spec()
    if task == "edit":
        from flowrl.world.edit import edit_vocabulary

        pipe = tiny_flux_pipeline(spec, words=edit_vocabulary(), seed=seed)
        edit_config = WorldEdit.Config(resolution=spec.image_size, max_sequence_length=spec.max_length)
        return _EditAdapter(pipe, edit_config)
    pipe = tiny_flux_pipeline(spec, words=vocabulary(), seed=seed)
    config = WorldTiny.Config(resolution=spec.image_size, max_sequence_length=spec.max_length)
    return _Adapter(pipe, config)


class _EditAdapter(WorldEdit):
    """The edit base around a pipeline built here (velocity with the source's tokens, as RL calls it)."""

    def __init__(self, pipe: Any, config: Any) -> None:
        self._fresh = pipe
        super().__init__(config)

    def load_pipeline(self) -> Any:
        return self._fresh


def parameter_counts(backbone: FluxAdapter) -> dict[str, int]:
    """Parameters of the transformer and of the two text encoders."""
    names = ("transformer", "text_encoder", "text_encoder_2")
    return {name: sum(p.numel() for p in getattr(backbone.pipe, name).parameters()) for name in names}


@contextlib.contextmanager
def swapped_in(params: list[tuple[str, torch.nn.Parameter]], shadow: dict[str, torch.Tensor] | None) -> Iterator[None]:
    """Temporarily load EMA weights (``shadow``) into ``params``; a no-op without EMA."""
    if shadow is None:
        yield
        return
    saved = [p.detach().clone() for _, p in params]
    with torch.no_grad():
        for name, p in params:
            p.copy_(shadow[name])
    try:
        yield
    finally:
        with torch.no_grad():
            for (_, p), value in zip(params, saved, strict=True):
                p.copy_(value)


def load_initial_weights(backbone: FluxAdapter, init: str) -> None:
    """Copy the transformer and text-encoder weights of the saved pipeline ``init`` into ``backbone``.

    When ``backbone``'s tokenizer has words the saved one lacks (the edit base's instruction words), the text
    encoders' token embeddings are carried over word by word and the new words keep their fresh rows."""
    from flowrl.backbones.flux.tiny import load_tiny_flux

    folder = resolve_folder(init)
    saved = load_tiny_flux(folder)
    old, new = saved.tokenizer_2.get_vocab(), backbone.pipe.tokenizer_2.get_vocab()
    for name in ("transformer", "text_encoder", "text_encoder_2"):
        state = getattr(saved, name).state_dict()
        if old != new and name != "transformer":
            state = _remap_vocabulary(state, getattr(backbone.pipe, name).state_dict(), old, new)
        try:
            getattr(backbone.pipe, name).load_state_dict(state)
        except RuntimeError as error:
            first = str(error).strip().splitlines()[-1].strip()
            raise PretrainRecipeError(str(folder), [("init", f"does not fit [model]: {name}: {first}")]) from None


TOKEN_EMBEDDINGS = ("token_embedding.weight", "shared.weight", "embed_tokens.weight")  # CLIP's, T5's (tied)


def _remap_vocabulary(
    saved: dict[str, torch.Tensor], fresh: dict[str, torch.Tensor], old: dict[str, int], new: dict[str, int]
) -> dict[str, torch.Tensor]:
    """``saved`` with every token-embedding matrix (``len(old)`` rows) laid out for ``new``: a word both know takes
    its saved row, a new word its row in ``fresh``."""
    common = [w for w in new if w in old]
    src = torch.tensor([old[w] for w in common])
    dst = torch.tensor([new[w] for w in common])
    out = dict(saved)
    for key, value in saved.items():
        target = fresh.get(key)
        if target is None or value.shape == target.shape or not key.endswith(TOKEN_EMBEDDINGS):
            continue
        if value.shape[0] == len(old) and target.shape == (len(new), value.shape[1]):
            remapped = target.clone()
            remapped[dst] = value[src]
            out[key] = remapped
    return out
