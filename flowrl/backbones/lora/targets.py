"""The transformer's module names from its configuration alone (no weights: the model is built on the meta
device), so that ``flowrl validate`` can check ``[lora] target_modules`` as attaching the adapters would.

A backbone answers through the static method ``transformer_on_meta(config)`` (the transformer built without
weights, or None when its configuration is not on this machine, e.g. a hub id not yet downloaded).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from torch import nn

ADAPTABLE = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Embedding)  # the layer types LoRA can adapt


def on_meta(build: Callable[[], nn.Module]) -> nn.Module:
    """``build()`` with every parameter on the meta device (no memory, no initialisation)."""
    from accelerate import init_empty_weights

    with init_empty_weights():
        return build()


def saved_transformer(path: str) -> nn.Module | None:
    """The transformer of a saved pipeline (a local folder, or a hub id already in the local cache) built on
    the meta device from its ``transformer/config.json``; None when that file is not on this machine."""
    config_file: Path | None = Path(path) / "transformer" / "config.json"
    if not config_file.is_file():  # type: ignore[union-attr]
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(path, "transformer/config.json")
        except Exception:  # not a valid repo id either
            return None
        config_file = Path(cached) if isinstance(cached, str) else None
    if config_file is None or not config_file.is_file():
        return None
    import diffusers

    config = json.loads(config_file.read_text())
    cls = getattr(diffusers, str(config.get("_class_name", "")), None)
    if cls is None:
        return None
    return on_meta(lambda: cls.from_config(config))


def matches(name: str, target: str) -> bool:
    """Whether the module ``name`` is selected by a LoRA ``target`` (the whole name, or its last parts)."""
    return name == target or name.endswith("." + target)


def lora_target_problems(recipe: Any) -> Iterator[tuple[str, str]]:
    """(key, why) for each ``[lora] target_modules`` entry that selects no adaptable layer of the recipe's
    transformer (peft ignores such an entry when another one matches, and fails only when none does)."""
    if recipe.lora is None:
        return
    part = recipe.parts["backbone"]
    build = getattr(part.cls, "transformer_on_meta", None)
    transformer = build(part.config) if build is not None else None
    if recipe.lora.init:  # an existing LoRA: its file and its layers are checked, not target_modules
        from flowrl.backbones.lora.load import init_problems

        names = None if transformer is None else [n for n, m in transformer.named_modules() if isinstance(m, nn.Linear)]
        yield from init_problems(recipe.lora.init, names)
        return
    if transformer is None:
        return
    modules = dict(transformer.named_modules())
    layers = [n for n, m in modules.items() if isinstance(m, ADAPTABLE)]
    names = sorted({".".join(n.split(".")[-2:]) if n.split(".")[-1].isdigit() else n.split(".")[-1] for n in layers})
    listed = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
    for target in recipe.lora.target_modules or part.cls.default_lora_targets(part.config):
        if any(matches(n, target) for n in layers):
            continue
        others = [n for n in modules if matches(n, target)]
        found = f"it selects {type(modules[others[0]]).__name__} '{others[0]}', not a layer" if others \
            else "no module has that name"
        yield ("lora.target_modules", f"'{target}' matches no adaptable layer of {part.type}'s transformer"
               f" ({found}); its layers' names end in: {listed}")
