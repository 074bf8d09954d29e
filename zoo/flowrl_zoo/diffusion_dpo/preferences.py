"""The offline preference file: one JSON object a line, a prompt with its preferred and its rejected image."""

from __future__ import annotations

import json
from pathlib import Path

import attrs

from flowrl.core.conditions import Condition, Prompt
from flowrl.core.errors import UserError
from flowrl.parts.prompts import read_text_file

KEYS = ("chosen", "rejected")  # the two image keys of a record


class PreferenceFileError(UserError, ValueError):
    """A preference file that cannot be used: missing, not JSON lines, a record without its keys, an image that is
    missing, unreadable, not RGB or of another size than the file's first."""


@attrs.frozen
class PreferencePair:
    """One record: the prompt (a :class:`~flowrl.core.conditions.Prompt` when it has condition images), the two
    images, and where the record is (``"[sampler.path] preference file F, line N"``) for later messages."""

    prompt: str
    chosen: Condition
    rejected: Condition
    where: str


def _image(folder: Path, record: dict, key: str, at: str) -> Condition:
    name = record.get(key)
    if not isinstance(name, str) or not name:
        raise PreferenceFileError(f'{at}: "{key}" must be an image path (relative to the file), got {name!r}')
    try:
        image = Condition.from_file(folder / name, f'{at}: "{key}" image {name}', "the preference file")
    except UserError as error:
        raise PreferenceFileError(str(error)) from None
    if image.mode != "RGB":
        raise PreferenceFileError(f'{at}: "{key}" image {name} is {image.mode}; save it as RGB')
    return image


def _conditions(folder: Path, record: dict, at: str) -> list[Condition]:
    if "image" in record and "images" in record:
        raise PreferenceFileError(f'{at}: give "image" (one condition path) or "images" (a list), not both')
    names = [record["image"]] if "image" in record else record.get("images", [])
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise PreferenceFileError(f'{at}: "image" is a condition image path and "images" a list of them')
    try:
        return [Condition.from_file(folder / n, f'{at}: condition image {n}', "the preference file") for n in names]
    except UserError as error:
        raise PreferenceFileError(str(error)) from None


def read_preferences(path: str, key: str = "sampler.path") -> list[PreferencePair]:
    """Every record of the preference file at ``path``, each image read and checked now; a problem is one
    :class:`PreferenceFileError` line naming the file, the line and the record's key.

    A record: ``{"prompt": "two red circles", "chosen": "img/0_w.png", "rejected": "img/0_l.png"}``, image paths
    relative to the file's folder, RGB, all of one size (the first record's). Optional condition images (an edit
    task's source) as in the JSONL prompt file: ``"image"`` (one path) or ``"images"`` (a list). Other keys are
    ignored; blank lines are skipped."""
    where = f"[{key}] preference file {path}"
    file = Path(path)
    text = read_text_file(file, where, PreferenceFileError)
    pairs: list[PreferencePair] = []
    size: tuple[int, int] | None = None
    for line_no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        at = f"{where}, line {line_no}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise PreferenceFileError(f"{at}: not JSON ({error.msg}, column {error.colno})") from None
        if not isinstance(record, dict):
            raise PreferenceFileError(f"{at}: expected a JSON object, got {line.strip()[:60]}")
        prompt = record.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise PreferenceFileError(f'{at}: "prompt" must be a non-empty string, got {prompt!r}')
        chosen, rejected = (_image(file.parent, record, k, at) for k in KEYS)
        for k, image in zip(KEYS, (chosen, rejected), strict=True):
            size = size or image.size
            if image.size != size:
                w, h = image.size
                raise PreferenceFileError(
                    f'{at}: "{k}" image {record[k]} is {w}x{h}, the file\'s first image is {size[0]}x{size[1]}; every'
                    " image must have one size"
                )
        conditions = _conditions(file.parent, record, at)
        pairs.append(PreferencePair(Prompt(prompt.strip(), conditions), chosen, rejected, at))
    if not pairs:
        raise PreferenceFileError(f'{where}: no records; write one a line: {{"prompt": …, "chosen": …, "rejected": …}}')
    return pairs
