"""Keeping the exporting machine's paths out of an exported folder.

A run's recipe names files by the paths it was given (``--set backbone.path=/data/models/flux-dev``), and
diffusers and transformers record where each model was loaded from (``_name_or_path`` in every ``config.json``).
None of that means anything on another machine and some of it says more than it should, so the exported
``recipe.toml`` names the shipped base (``base``) or the hub id instead of the base's folder, and every other
absolute path by its path relative to the working folder (where recipes keep their files) or else its file name,
each said in a comment at its top; ``_name_or_path`` keys holding a local path are dropped from the configs;
and a last scan names any file that still holds one of the machine's paths.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tomllib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from flowrl.config.tomlwrite import dumps

# huggingface_hub's cache keeps a hub repository's files in .../models--OWNER--NAME/snapshots/<commit>/
CACHE_SNAPSHOT = re.compile(r"(?:^|/)models--([A-Za-z0-9][\w.-]*)--([\w.-]+)/snapshots/[0-9a-f]+/?$")
PATH_KEYS = ("_name_or_path", "name_or_path", "base_model_name_or_path")  # configs' records of a load location
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".png", ".webp", ".gif", ".jpg")
SAFETENSORS_HEADER_LIMIT = 100 << 20  # safetensors' own limit on its JSON header


def hub_id_of_cache_folder(path: str) -> str:
    """``OWNER/NAME`` when ``path`` is a snapshot folder of the Hugging Face cache, else ""."""
    found = CACHE_SNAPSHOT.search(Path(path).resolve().as_posix())
    return f"{found.group(1)}/{found.group(2)}" if found else ""


def is_local_path(value: str) -> bool:
    """An absolute path (``/...``, ``~/...``, ``C:\\...``; not a URL, not a relative path) that is on this machine
    or looks like one (no spaces: a prompt such as "/imagine a cat" is no path)."""
    absolute = os.path.isabs(value) or value.startswith("~/") or bool(re.match(r"^[A-Za-z]:[\\/]", value))
    return absolute and (not any(c.isspace() for c in value) or _exists(value))


def _exists(value: str) -> bool:
    try:
        return Path(os.path.expanduser(value)).exists()
    except (OSError, ValueError):  # a name too long for the file system, a NUL byte
        return False


def portable(value: str, cwd: Path) -> str:
    """An absolute path as a recipe keeps it: relative to ``cwd`` when under it, else its last part."""
    path = Path(os.path.expanduser(value))
    try:
        return path.resolve().relative_to(cwd.resolve()).as_posix() or "."
    except ValueError:
        return path.name


def _walk(data: Any, prefix: str = "") -> Iterator[tuple[str, Any, Any, Any]]:
    """(dotted key, container, key or index, value) of every string in nested tables and lists."""
    items: Iterable[tuple[Any, Any]] = data.items() if isinstance(data, dict) else enumerate(data)
    for key, value in items:
        name = f"{prefix}.{key}" if isinstance(data, dict) and prefix else str(key) if isinstance(data, dict) \
            else f"{prefix}[{key}]"
        if isinstance(value, str):
            yield name, data, key, value
        elif isinstance(value, dict | list):
            yield from _walk(value, name)


def portable_recipe(text: str, base: str, cwd: Path) -> str:
    """A resolved recipe's text with ``backbone.path`` set to ``base`` (the hub id, or the folder of the base shipped
    in the export; "" keeps it) and every other absolute path made portable (:func:`portable`), each change said
    in a comment at the top; the text unchanged when nothing named a file of this machine."""
    data = tomllib.loads(text)
    header = []
    backbone = data.get("backbone")
    if base and isinstance(backbone, dict) and backbone.get("path", "") not in ("", base):
        backbone["path"] = base
        where = "the hub id of the base" if _hub_like(base) else "the base pipeline shipped in this folder"
        header.append(f"# backbone.path = {json.dumps(base)}: {where}")
    for key, container, index, value in list(_walk(data)):
        if is_local_path(value):
            container[index] = portable(value, cwd)
            header.append(f"# {key} = {json.dumps(container[index])}: was an absolute path; put the file there")
    if not header:
        return text
    intro = "# The resolved recipe of the exported run, with the paths of the exporting machine replaced:"
    return "\n".join([intro, *header]) + "\n\n" + dumps(data)


def _hub_like(value: str) -> bool:
    return bool(re.match(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$", value)) and not Path(value).exists()


def _drop_local_paths(data: Any) -> bool:
    """Remove, in place, the load-location keys whose value is a local path; whether any was removed."""
    changed = False
    if isinstance(data, dict):
        for key in [k for k in data if k in PATH_KEYS and isinstance(data[k], str) and is_local_path(data[k])]:
            del data[key]
            changed = True
        for value in data.values():
            changed = _drop_local_paths(value) or changed
    elif isinstance(data, list):
        for value in data:
            changed = _drop_local_paths(value) or changed
    return changed


def scrub_configs(folder: Path) -> None:
    """Drop ``_name_or_path`` (and the like) holding a local path from every JSON file under ``folder``."""
    for file in sorted(Path(folder).rglob("*.json")):
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            continue  # not a JSON config: the leak scan below still reads it
        if _drop_local_paths(data):
            file.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def machine_paths(*given: Path | None) -> list[str]:
    """The absolute paths of this machine an export must not hold: the given ones (the run, the checkpoint, the
    base's folder), the working folder, the home folder, flowrl's installation and Python's."""
    roots = [*(p for p in given if p is not None), Path.cwd(), Path.home(), Path(__file__).resolve().parents[2],
             Path(sys.prefix)]
    found = {str(Path(p).expanduser().resolve()) for p in roots} | {str(p) for p in roots if Path(p).is_absolute()}
    return sorted((p for p in found if len(p.strip("/\\")) > 2), key=len, reverse=True)


def _readable(file: Path) -> bytes:
    """A file's bytes to scan: all of a text file, the JSON header of a safetensors file, nothing of other weights
    and images (their bytes are numbers)."""
    if file.suffix == ".safetensors":
        with file.open("rb") as handle:
            size = int.from_bytes(handle.read(8), "little")
            return handle.read(size) if 0 < size <= SAFETENSORS_HEADER_LIMIT else b""
    if file.suffix in WEIGHT_SUFFIXES:
        return b""
    return file.read_bytes()


def leaks(folder: Path, paths: Iterable[str]) -> list[tuple[Path, str]]:
    """(file, path) for each file under ``folder`` that still names one of ``paths``."""
    wanted = [(p, p.encode()) for p in paths]
    out = []
    for file in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        data = _readable(file)
        hit = next((p for p, raw in wanted if raw in data), None)
        if hit is not None:
            out.append((file, hit))
    return out
