"""Settings checks shared by backbones, run at recipe load (``Component.check_config``) before any model is built."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

# The tiny specs' field names that the recipe names otherwise (spec name -> recipe key).
SPEC_RENAMES = {"image_size": "resolution", "max_length": "max_sequence_length"}
_WORDS = {3: "three", 4: "four"}


def check_rotary_axes(axes: tuple[int, ...], parts: int, head_dim: int, labels: str = "") -> None:
    """A tiny spec's rotary split, refused (``ValueError``) unless it is ``parts`` even numbers summing to the
    attention head's width; ``labels`` names the axes in the message (``"t, h, w, l"``)."""
    if len(axes) != parts or any(d % 2 for d in axes):
        named = f" ({labels})" if labels else ""
        raise ValueError(f"axes_dims_rope must be {_WORDS[parts]} even numbers{named}, got {axes}")
    if sum(axes) != head_dim:
        raise ValueError(f"axes_dims_rope {axes} must sum to attention_head_dim {head_dim}")


def spec_problems(spec: Callable[[Any], Any], config: Any) -> list[tuple[str, str]]:
    """``check_config`` for a tiny backbone: build its spec from ``config`` (cheap, no model) and turn the
    spec's refusal into ``(recipe key, message)``, with the spec's field names (:data:`SPEC_RENAMES`) replaced
    by the recipe's, and the key the first of ``config``'s fields the message names, in reading order ("" if
    none)."""
    try:
        spec(config)
    except ValueError as error:
        text = str(error)
        for old, new in SPEC_RENAMES.items():
            text = re.sub(rf"\b{old}\b", new, text)
        found = [(m.start(), k) for k in attrs.fields_dict(type(config)) if (m := re.search(rf"\b{k}\b", text))]
        key = min(found)[1] if found else ""
        return [(key, text)]
    return []


def saved_json(path: str, name: str) -> dict[str, Any] | None:
    """A JSON file of a saved pipeline (a local folder, or a hub id already in the local cache); None if absent."""
    file = Path(path) / name
    if not file.is_file():
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(path, name)
        except Exception:  # not a valid repo id either
            return None
        if not isinstance(cached, str):
            return None
        file = Path(cached)
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def packed_vae_multiple(vae_config: dict[str, Any]) -> int:
    """What an image side must be a multiple of for a FLUX-style base: the VAE's pixels per latent cell
    (``2 ** (len(block_out_channels) - 1)``, as the pipelines compute it) times the 2 x 2 packing of cells into a
    token."""
    return int(2 ** (len(vae_config.get("block_out_channels", (0,) * 4)) - 1) * 2)
