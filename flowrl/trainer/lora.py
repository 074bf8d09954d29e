"""LoRA adapters (peft) on the backbone's transformer, and the reference policy they make free."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn

from flowrl.settings import LoraConfig


def add_lora(transformer: nn.Module, config: LoraConfig, default_targets: tuple[str, ...] | None = None) -> None:
    """Freeze the transformer and attach trainable LoRA adapters to ``config.target_modules`` (a recipe fills them
    in from its backbone's ``lora_targets``; a config built directly without them uses ``default_targets``, else
    the attention projections every diffusers transformer has)."""
    from peft import LoraConfig as PeftLoraConfig

    from flowrl.interfaces import Backbone

    if config.init:  # an existing LoRA: its own rank, alpha and layers, its weights (flowrl.backbones.lora_import)
        from flowrl.backbones.lora_import import attach_lora_file

        attach_lora_file(transformer, config.init, config.dropout)
        return
    targets = config.target_modules or default_targets or Backbone.lora_targets

    transformer.requires_grad_(False)
    transformer.add_adapter(  # type: ignore[operator]
        PeftLoraConfig(
            r=config.rank,
            lora_alpha=config.alpha,
            lora_dropout=config.dropout,
            init_lora_weights="gaussian",
            target_modules=list(targets),
        )
    )


@contextmanager
def adapters_disabled(transformer: nn.Module) -> Iterator[None]:
    """The base model (LoRA off) inside the block: the reference policy for KL terms."""
    transformer.disable_adapters()  # type: ignore[operator]
    try:
        yield
    finally:
        transformer.enable_adapters()  # type: ignore[operator]
