"""Reading a suite's prompts: a fetched set (``flowrl data fetch NAME``, into the data folder) or a file of the
user's. Formats: ``.jsonl`` (one object a line: ``prompt``, optional ``category`` and whatever the scorer
reads), ``.json`` (a list of prompt strings, as the HPSv2 benchmark ships its styles), ``.tsv`` (PartiPrompts:
``Prompt`` and ``Category`` columns, split on tabs with no quoting), ``.txt`` (one prompt a line)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flowrl.suites.data import PromptSetError, fetched
from flowrl.suites.interface import Item


def suite_items(own: str, name: str) -> list[Item]:
    """A suite's items: the user's prompt file ``own`` when given, else the fetched set ``name``; a file that
    holds no prompt is refused, naming it, before any model loads."""
    path = Path(own) if own else fetched(name)
    items = read_items(path)
    if not items:
        raise PromptSetError(f"{path}: no prompts in the file")
    return items


def read_items(path: Path, category: str = "") -> list[Item]:
    """The items of a prompt file (format by suffix); ``category`` for files that name none."""
    path = Path(path)
    if not path.exists():
        raise PromptSetError(f"{path}: no such prompt file")
    try:
        text = path.read_text(encoding="utf-8-sig")  # a byte-order mark is not part of the first prompt
    except (OSError, UnicodeDecodeError) as error:
        raise PromptSetError(f"{path}: cannot be read as UTF-8 text ({error})") from None
    if path.suffix == ".json":
        try:
            found = json.loads(text)
        except ValueError as error:
            raise PromptSetError(f"{path}: not valid JSON ({error})") from None
        if not isinstance(found, list) or not all(isinstance(p, str) for p in found):
            raise PromptSetError(f"{path}: expected a JSON list of prompt strings")
        return [Item(p, category) for p in found]
    if path.suffix == ".tsv":
        lines = text.splitlines()
        header = lines[0].split("\t") if lines else []
        if "Prompt" not in header:
            raise PromptSetError(f"{path}: line 1 has no Prompt column (a PartiPrompts-style TSV needs one)")
        at, cat = header.index("Prompt"), header.index("Category") if "Category" in header else None
        rows = [line.split("\t") for line in lines[1:] if line.strip()]
        return [Item(r[at], r[cat] if cat is not None and cat < len(r) else category,
                     {h: r[i] for i, h in enumerate(header) if i < len(r) and i != at}) for r in rows]
    if path.suffix == ".jsonl":
        items = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                row: Any = json.loads(line)
            except ValueError:
                raise PromptSetError(f"{path}: line {number} is not valid JSON") from None
            if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
                raise PromptSetError(f"{path}: line {number} has no \"prompt\" string")
            meta = {k: v for k, v in row.items() if k not in ("prompt", "category")}
            items.append(Item(row["prompt"], str(row.get("category", category)), meta))
        return items
    return [Item(line.strip(), category) for line in text.splitlines() if line.strip()]
