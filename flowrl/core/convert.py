"""Plain data (TOML tables) to validated attrs configs, collecting every problem with its key path."""

from __future__ import annotations

import difflib
import math
import types
import typing
from collections.abc import Mapping
from typing import Any

import attrs

from flowrl.core.errors import UserError


class ConfigError(UserError, ValueError):
    """One or more problems, each a (key path, message) pair."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"[{path}] {msg}" for path, msg in problems))


def structure(cls: type, data: Mapping[str, Any], path: str = "") -> Any:
    """Build attrs class ``cls`` from ``data``; raise :class:`ConfigError` listing every problem."""
    problems: list[tuple[str, str]] = []
    value = _structure(cls, dict(data), path, problems)
    if problems:
        raise ConfigError(problems)
    return value


def _structure(cls: type, data: dict[str, Any], path: str, problems: list[tuple[str, str]]) -> Any:
    attrs.resolve_types(cls)
    fields = {f.name: f for f in attrs.fields(cls)}
    for key in data:
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else f"; known keys: {', '.join(fields) or 'none'}"
            problems.append((_join(path, key), f"unknown key{hint}"))
    kwargs: dict[str, Any] = {}
    before = len(problems)
    for name, field in fields.items():
        if name not in data:
            if field.default is attrs.NOTHING:
                problems.append((_join(path, name), "missing required key"))
            continue
        try:
            value = convert(field.type, data[name], _join(path, name), problems)
        except _Skip:
            continue
        if field.validator is not None:
            try:
                field.validator(None, field, value)
            except (ValueError, TypeError) as error:
                problems.append((_join(path, name), _validator_message(error, value)))
                continue
        kwargs[name] = value
    if len(problems) > before:
        return None
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as error:
        problems.append((path or cls.__name__, str(error)))
        return None


class _Skip(Exception):
    pass


def convert(tp: Any, value: Any, path: str, problems: list[tuple[str, str]]) -> Any:
    """Convert ``value`` to type ``tp`` (records a problem and raises _Skip when it cannot)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any or tp is None:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return convert(inner[0], value, path, problems)
        for candidate in inner:
            try:
                return convert(candidate, value, path, [])
            except _Skip:
                continue
        return _fail(path, f"expected {_name(tp)}, got {value!r}", problems)
    if origin is typing.Literal:
        if value in args:
            return value
        return _fail(path, f"expected one of {', '.join(map(repr, args))}, got {value!r}", problems)
    if origin in (tuple, list):
        if not isinstance(value, list | tuple):
            return _fail(path, f"expected a list, got {value!r}", problems)
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            items = [convert(args[0], v, f"{path}[{i}]", problems) for i, v in enumerate(value)]
            return tuple(items)
        if origin is tuple and args:
            if len(args) != len(value):
                return _fail(path, f"expected {len(args)} items, got {len(value)}", problems)
            pairs = enumerate(zip(args, value, strict=True))
            return tuple(convert(a, v, f"{path}[{i}]", problems) for i, (a, v) in pairs)
        item_type = args[0] if args else Any
        return [convert(item_type, v, f"{path}[{i}]", problems) for i, v in enumerate(value)]
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            return _fail(path, f"expected a table, got {value!r}", problems)
        return dict(value)
    if attrs.has(tp):
        if not isinstance(value, dict):
            return _fail(path, f"expected a table, got {value!r}", problems)
        result = _structure(tp, value, path, problems)
        if result is None:
            raise _Skip
        return result
    if tp is bool:
        if isinstance(value, bool):
            return value
        return _fail(path, f"expected true or false, got {value!r}", problems)
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        return _fail(path, f"expected an integer, got {value!r}", problems)
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            if not math.isfinite(value):  # TOML reads inf and nan; no setting means either
                return _fail(path, f"expected a finite number, got {value!r}", problems)
            return float(value)
        return _fail(path, f"expected a number, got {value!r}", problems)
    if tp is str:
        if isinstance(value, str):
            return value
        return _fail(path, f"expected a string, got {value!r}", problems)
    return value


def _fail(path: str, message: str, problems: list[tuple[str, str]]) -> Any:
    problems.append((path, message))
    raise _Skip


def _validator_message(error: Exception, value: Any) -> str:
    text = str(error.args[0]) if error.args else str(error)
    if text.startswith("'"):  # attrs' messages repeat the field name: "'lr' must be > 0: -1"
        text = text.split(" ", 1)[1] if " " in text else text
        return f"{text.split(':')[0]} (got {value!r})"
    return text


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def unstructure(value: Any) -> Any:
    """An attrs instance (or nested values) back to plain TOML-able data."""
    if attrs.has(type(value)):
        return {f.name: unstructure(getattr(value, f.name)) for f in attrs.fields(type(value))}
    if isinstance(value, list | tuple):
        return [unstructure(v) for v in value]
    if isinstance(value, dict):
        return {k: unstructure(v) for k, v in value.items()}
    return value
