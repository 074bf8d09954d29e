"""What a suite result may claim, decided from what was generated and scored, never from which options were used.

- **Comparable with published figures** only when the prompts generated are the suite's published set (the hash
  of their texts and metadata equals the hash of the set read from its source), the scorers and their settings
  are the suite's own, the protocol is the pinned one, and every image was scored. Otherwise the result says
  which of these differs.
- **Paired** with another result only on the prompts both generated with the same text and metadata, under the
  same noise rule, seed, images per prompt and resolution: only then do two columns' images of a prompt start
  from the same noise, so that their difference is the policies' alone.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from flowrl.suites.interface import Item

NOISE_KEYS = ("noise", "seed", "images", "resolution")  # what decides each image's initial noise


def item_hash(item: Item) -> str:
    """A prompt's identity: its text, its condition images (their pixel digests), category and the metadata its
    scorer reads."""
    from flowrl.core.conditions import conditions_of

    images = [c.key for c in conditions_of(item.prompt)]
    text = json.dumps([str(item.prompt), item.category, item.meta, *([images] if images else [])], sort_keys=True,
                      default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def set_hash(items: Sequence[Item]) -> str:
    """The identity of a prompt list, in its order."""
    return hashlib.sha256(json.dumps([item_hash(i) for i in items]).encode()).hexdigest()


def prompt_problems(used: Sequence[Item], published: Sequence[Item] | None, source: str) -> list[str]:
    """Why the prompts ``used`` are not the published set (none when they are)."""
    if published is None:
        return [f"the published prompt set was not read ({source}), so the prompts cannot be checked against it"]
    if set_hash(used) == set_hash(published):
        return []
    known = {item_hash(i) for i in published}
    if len(used) < len(published) and all(item_hash(i) in known for i in used):
        return [f"a subset: {len(used)} of the {len(published)} published prompts"]
    return [f"not the published prompts ({len(used)} prompts, {sum(item_hash(i) not in known for i in used)} of "
            f"them not in the published set of {len(published)})"]


def protocol_problems(facts: dict[str, Any]) -> list[str]:
    if facts.get("pinned", False):
        return []
    changes = facts.get("protocol_changes") or {}
    said = ", ".join(f"{k} = {v}" for k, v in changes.items()) or "changed"
    return [f"not the pinned protocol ({said})"]


def noise_of(summary: dict[str, Any]) -> dict[str, Any]:
    protocol = summary.get("protocol") or {}
    return {key: protocol.get(key) for key in NOISE_KEYS}


def pairing(first: dict[str, Any], other: dict[str, Any]) -> tuple[list[int], str]:
    """The prompt indices ``other`` can be paired with ``first`` on, and why none can (``""`` when some can)."""
    if "item_hashes" not in first or "item_hashes" not in other:
        return [], "not paired: a result scored before flowrl recorded prompt hashes (score it again)"
    a, b = noise_of(first), noise_of(other)
    if a != b:
        differs = "; ".join(f"{k} {b[k]} vs {a[k]}" for k in NOISE_KEYS if a[k] != b[k])
        return [], f"not paired: other initial noise than the first column ({differs})"
    mine = dict(zip(first["prompts"], first["item_hashes"], strict=True))
    shared = [p for p, h in zip(other["prompts"], other["item_hashes"], strict=True) if mine.get(p) == h]
    if not shared:
        return [], "not paired: no prompt in common with the first column"
    return shared, ""
