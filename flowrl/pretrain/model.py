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
from flowrl.world.grammar import vocabulary


class _Adapter(FluxAdapter):
    """The FLUX adapter around a pipeline built here (so velocity and decoding match the world_tiny backbone)."""

    def __init__(self, pipe: Any, config: Any) -> None:
        self._fresh = pipe
        super().__init__(config)

    def load_pipeline(self) -> Any:
        return self._fresh


def build_backbone(model: ModelConfig, seed: int) -> FluxAdapter:
    """A randomly initialised pixel-space tiny FLUX over the world's vocabulary, behind the FLUX adapter."""
    from flowrl.world.components import WorldTiny

    spec = model.spec()
    pipe = tiny_flux_pipeline(spec, words=vocabulary(), seed=seed)
    config = WorldTiny.Config(resolution=spec.image_size, max_sequence_length=spec.max_length)
    return _Adapter(pipe, config)


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
    """Copy the transformer and text-encoder weights of the saved pipeline ``init`` into ``backbone``."""
    from flowrl.backbones.flux.tiny import load_tiny_flux

    folder = resolve_folder(init)
    saved = load_tiny_flux(folder)
    for name in ("transformer", "text_encoder", "text_encoder_2"):
        try:
            getattr(backbone.pipe, name).load_state_dict(getattr(saved, name).state_dict())
        except RuntimeError as error:
            first = str(error).strip().splitlines()[-1].strip()
            raise PretrainRecipeError(str(folder), [("init", f"does not fit [model]: {name}: {first}")]) from None
