"""LoRA adapters (peft) on the backbone's transformer, and the reference policy they make free."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from torch import nn

from flowrl.config.settings import LoraConfig


def add_lora(transformer: nn.Module, config: LoraConfig, default_targets: tuple[str, ...] | None = None) -> None:
    """Freeze the transformer and attach trainable LoRA adapters to ``config.target_modules`` (a recipe fills them
    in from its backbone's ``lora_targets``; a config built directly without them uses ``default_targets``, else
    the attention projections every diffusers transformer has)."""
    from peft import LoraConfig as PeftLoraConfig

    from flowrl.core.interfaces import Backbone

    if config.init:  # an existing LoRA: its own rank, alpha and layers, its weights (flowrl.backbones.lora.load)
        from flowrl.backbones.lora.load import attach_lora_file

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


def own_lora(folder: Path, recipe_file: Path) -> list[str]:
    """``lora.init`` pointed at the checkpoint's own LoRA export, for a run that started from an existing LoRA: the
    export has the adapter's layers, rank and alpha (and the trained tensors, which the weights then replace), so
    the checkpoint opens wherever it is moved, without the file the run started from."""
    import tomllib

    try:
        init = tomllib.loads(recipe_file.read_text(encoding="utf-8")).get("lora", {}).get("init", "")
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, AttributeError):
        return []  # loading the recipe itself names what is wrong with it
    from flowrl.backbones.lora.export import LORA_FOLDER

    export = Path(folder) / LORA_FOLDER
    return [f"lora.init={json.dumps(str(export))}"] if init and export.is_dir() else []
