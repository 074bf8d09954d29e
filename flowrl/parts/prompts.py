"""Prompt sources: an inline list, a text file (one prompt per line) and a JSONL file of prompts with condition
images (flowrl.core.conditions)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import attrs
import torch

from flowrl.core.conditions import Condition, Prompt
from flowrl.core.errors import UserError
from flowrl.core.interfaces import PromptSource
from flowrl.core.registry import register


class PromptFileError(UserError, ValueError):
    """A prompt file that cannot be used (missing, empty, not UTF-8)."""


def _draw(prompts: list[str], n: int, generator: torch.Generator) -> list[str]:
    index = torch.randint(len(prompts), (n,), generator=generator)
    return [prompts[int(i)] for i in index]


@register("prompts", "list")
class PromptList(PromptSource):
    """Prompts given inline in the recipe; drawn uniformly with replacement."""

    @attrs.frozen
    class Config:
        prompts: tuple[str, ...] = attrs.field(validator=attrs.validators.min_len(1))
        heldout: tuple[str, ...] = ()

    @classmethod
    def gives_conditions(cls, config: Config) -> Literal["none"]:
        return "none"

    def sample(self, n: int, generator: torch.Generator) -> list[str]:
        return _draw(list(self.config.prompts), n, generator)

    def heldout(self) -> list[str]:
        return list(self.config.heldout)


def read_text_file(path: str | Path, where: str, error: type[UserError] = PromptFileError) -> str:
    """A user's text file (UTF-8, a byte-order mark dropped); ``error`` (a prompt file's by default), its message
    starting with ``where``, when it is missing or unreadable."""
    try:
        return Path(path).read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise error(f"{where}: no such file (a relative path starts at the working directory)") from None
    except UnicodeDecodeError as problem:
        raise error(f"{where}: not UTF-8 text (byte {problem.start}); save it as UTF-8") from None
    except OSError as problem:
        raise error(f"{where}: cannot read ({problem.strerror or problem})") from None


def read_prompt_file(path: str, key: str = "prompts.path") -> list[str]:
    """Non-empty stripped lines of a UTF-8 text file; :class:`PromptFileError` names the file and key otherwise."""
    where = f"[{key}] prompt file {path}"
    text = read_text_file(path, where)
    prompts = [line.strip() for line in text.splitlines() if line.strip()]
    if not prompts:
        raise PromptFileError(f"{where}: no prompts (the file is empty); write one prompt per line")
    return prompts


@register("prompts", "text_file")
class PromptFile(PromptSource):
    """Prompts from a UTF-8 text file, one per line (blank lines ignored); optional held-out file."""

    @attrs.frozen
    class Config:
        path: str = attrs.field(validator=attrs.validators.min_len(1))  # relative to the working directory
        heldout_path: str = ""

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.prompts = read_prompt_file(config.path)
        self._heldout = read_prompt_file(config.heldout_path, "prompts.heldout_path") if config.heldout_path else []

    @classmethod
    def gives_conditions(cls, config: Config) -> Literal["none"]:
        return "none"

    def sample(self, n: int, generator: torch.Generator) -> list[str]:
        return _draw(self.prompts, n, generator)

    def heldout(self) -> list[str]:
        return list(self._heldout)


def _jsonl_records(path: str, key: str) -> list[tuple[str, str]]:
    """The records of a JSONL prompt file (see :class:`PromptJsonl`) as (where, prompt), each image checked; every
    problem is a :class:`PromptFileError` naming the file, the record and its line."""
    where = f"[{key}] prompt file {path}"
    text = read_text_file(path, where)
    folder = Path(path).parent
    prompts: list[tuple[str, str]] = []
    for line_no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        at = f"{where}, record {len(prompts) + 1} (line {line_no})"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            problem = f"not JSON ({error.msg}, column {error.colno})"
            raise PromptFileError(f"{at}: {problem}; write one JSON object a line") from None
        if not isinstance(record, dict) or not isinstance(record.get("prompt"), str) or not record["prompt"].strip():
            raise PromptFileError(f'{at}: expected an object with a non-empty "prompt" string, got {line.strip()[:60]}')
        if "image" in record and "images" in record:
            raise PromptFileError(f'{at}: give "image" (one path) or "images" (a list), not both')
        images = [record["image"]] if "image" in record else record.get("images", [])
        if not isinstance(images, list) or not all(isinstance(i, str) and i for i in images):
            raise PromptFileError(f'{at}: "image" is a path and "images" a list of paths (relative to the file)')
        conditions = [Condition.from_file(folder / name, f"{at}: image {name}") for name in images]
        prompts.append((at, Prompt(record["prompt"].strip(), conditions)))
    if not prompts:
        raise PromptFileError(f'{where}: no records (the file is empty); write one JSON object a line: {{"prompt": …}}')
    return prompts


@register("prompts", "jsonl")
class PromptJsonl(PromptSource):
    """Prompts with condition images (an edit's source image) from a JSONL file; optional held-out file.

    One record a line (blank lines ignored), ``{"prompt": "make the red circle green", "image": "src/0.png"}``:
    ``prompt`` is the text (an edit's instruction); ``image`` one path or ``images`` a list of paths, relative to
    the file's folder, in the order the base defines; a record without images is a text-to-image prompt. Other keys
    are ignored. Every image is read and checked when the source is built, before any model loads, and held to
    what the backbone takes; a problem stops with one line naming the file, the record and the image
    (docs/editing.md)."""

    @attrs.frozen
    class Config:
        path: str = attrs.field(validator=attrs.validators.min_len(1))  # relative to the working directory
        heldout_path: str = ""

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.records = _jsonl_records(config.path, "prompts.path")
        held = _jsonl_records(config.heldout_path, "prompts.heldout_path") if config.heldout_path else []
        self.heldout_records = held
        self.prompts = [prompt for _, prompt in self.records]

    def sample(self, n: int, generator: torch.Generator) -> list[str]:
        return _draw(self.prompts, n, generator)

    def heldout(self) -> list[str]:
        return [prompt for _, prompt in self.heldout_records]

    def condition_records(self) -> Iterator[tuple[str, str]]:
        yield from ((f"{at}:", prompt) for at, prompt in (*self.records, *self.heldout_records))
