"""Prompt sources: an inline list and a text file (one prompt per line)."""

from __future__ import annotations

from pathlib import Path

import attrs
import torch

from flowrl.errors import UserError
from flowrl.interfaces import PromptSource
from flowrl.registry import register


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

    def sample(self, n: int, generator: torch.Generator) -> list[str]:
        return _draw(list(self.config.prompts), n, generator)

    def heldout(self) -> list[str]:
        return list(self.config.heldout)


def read_prompt_file(path: str, key: str = "prompts.path") -> list[str]:
    """Non-empty stripped lines of a UTF-8 text file; :class:`PromptFileError` names the file and key otherwise."""
    where = f"[{key}] prompt file {path}"
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise PromptFileError(f"{where}: no such file (a relative path starts at the working directory)") from None
    except UnicodeDecodeError as error:
        raise PromptFileError(f"{where}: not UTF-8 text (byte {error.start}); save it as UTF-8") from None
    except OSError as error:
        raise PromptFileError(f"{where}: cannot read ({error.strerror or error})") from None
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

    def sample(self, n: int, generator: torch.Generator) -> list[str]:
        return _draw(self.prompts, n, generator)

    def heldout(self) -> list[str]:
        return list(self._heldout)
