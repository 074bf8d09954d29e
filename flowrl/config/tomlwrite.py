"""A small TOML writer for resolved recipes (scalars, lists, tables, arrays of tables)."""

from __future__ import annotations

import json
import math
from typing import Any


def dumps(data: dict[str, Any]) -> str:
    """Serialise nested dicts: top-level scalars first, then ``[table]`` and ``[[array]]`` sections."""
    lines: list[str] = []
    _emit(data, "", lines)
    return "\n".join(lines).strip() + "\n"


def _emit(table: dict[str, Any], prefix: str, lines: list[str]) -> None:
    scalars = {k: v for k, v in table.items() if not _is_table(v) and not _is_table_array(v)}
    for key, value in scalars.items():
        if value is not None:
            lines.append(f"{_key(key)} = {_value(value)}")
    for key, value in table.items():
        name = f"{prefix}.{_key(key)}" if prefix else _key(key)
        if _is_table(value):
            lines.extend(["", f"[{name}]"])
            _emit(value, name, lines)
        elif _is_table_array(value):
            for item in value:
                lines.extend(["", f"[[{name}]]"])
                _emit(item, name, lines)


def _is_table(value: Any) -> bool:
    return isinstance(value, dict)


def _is_table_array(value: Any) -> bool:
    return isinstance(value, list | tuple) and bool(value) and all(isinstance(v, dict) for v in value)


def _key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() else json.dumps(key)


def _value(value: Any) -> str:
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v) for v in value if v is not None) + "]"
    return scalar(value)


def scalar(value: Any) -> str:
    """A boolean, integer, float or string as TOML writes it (a ``TypeError`` for anything else)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        if math.isnan(value):
            return "nan"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    raise TypeError(f"cannot write {value!r} to TOML")
