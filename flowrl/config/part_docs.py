"""A registered part's documentation as data: its summary and body from the docstring, and its config fields
(type, default, constraints read from the attrs validators, the field's source comment). ``flowrl ls NAME``
prints it, and scripts/gen_reference.py writes docs/reference.md from it."""

from __future__ import annotations

import inspect
import io
import re
import textwrap
import tokenize
import types
import typing
from typing import Any

import attrs

from flowrl.config.tomlwrite import scalar


# -- docstrings ------------------------------------------------------------------------------------------
def markdown(text: str) -> str:
    """reST inline literals and roles (````x````, ``:class:`x```) to markdown (```x```), lines joined."""
    text = " ".join(line.strip() for line in text.splitlines()).replace("``", "`").strip()
    return re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", text)  # :class:`X` -> `X`


def paragraphs(doc: str | None) -> list[str]:
    text = inspect.cleandoc(doc or "")
    return [p for p in (p.strip() for p in text.split("\n\n")) if p]


def summary_and_body(cls: type) -> tuple[str, str]:
    """The docstring's first line, and its first paragraph if longer than that line, else the second one."""
    paras = paragraphs(cls.__doc__)
    if not paras:
        return "", ""
    first = paras[0].splitlines()[0].strip()
    if markdown(paras[0]) != markdown(first):
        return markdown(first), markdown(paras[0])
    return markdown(first), markdown(paras[1]) if len(paras) > 1 else ""


# -- config fields ---------------------------------------------------------------------------------------
def field_comments(config: type) -> dict[str, str]:
    """``name -> comment`` from the trailing ``# ...`` comments of each field in the class source."""
    try:
        source = textwrap.dedent(inspect.getsource(config))
    except (OSError, TypeError):
        return {}
    names = {f.name for f in attrs.fields(config)}
    lines = source.splitlines()
    starts: dict[int, str] = {}  # line number (1-based) -> field name
    body_indent: int | None = None
    header = next((i for i, line in enumerate(lines, 1) if line.lstrip().startswith("class ")), len(lines))
    for number, line in enumerate(lines, 1):
        stripped = line.lstrip()
        if number <= header or not stripped or stripped.startswith(("#", ")", "]", "}")):
            continue
        indent = len(line) - len(stripped)
        if body_indent is None:
            body_indent = indent
        if indent == body_indent:
            head = stripped.split(":", 1)[0].strip()
            starts[number] = head if head in names and ":" in stripped else ""
    comments: dict[str, list[str]] = {}
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError):
        return {}
    for tok in tokens:
        if tok.type != tokenize.COMMENT:
            continue
        row = tok.start[0]
        text = tok.string.lstrip("#").strip()
        if not text or text.startswith(("type:", "noqa")):
            continue
        if lines[row - 1].lstrip().startswith("#"):  # a full-line comment describes the next field
            owner = next((starts[r] for r in sorted(starts) if r > row), "")
        else:  # a trailing comment describes the field whose definition it ends
            owner = next((starts[r] for r in sorted(starts, reverse=True) if r <= row), "")
        if owner:
            comments.setdefault(owner, []).append(text)
    return {k: " ".join(v) for k, v in comments.items()}


def type_name(tp: Any) -> str:
    if isinstance(tp, str):
        return tp
    if tp is type(None):
        return "None"
    if isinstance(tp, type) and not typing.get_args(tp) and not isinstance(tp, types.GenericAlias):
        return tp.__name__
    return repr(tp).replace("typing.", "")


def field_type(config: type, field: attrs.Attribute) -> str:
    try:
        hints = typing.get_type_hints(config)
    except Exception:  # unresolvable annotations: show them as written
        hints = {}
    return type_name(hints.get(field.name, field.type))


def toml_value(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool | int | float | str):
        return scalar(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + "}"
    if attrs.has(type(value)):
        return toml_value(attrs.asdict(value))
    return type(value).__name__


def field_default(field: attrs.Attribute) -> str:
    default: Any = field.default
    if default is attrs.NOTHING:
        return "**required**"
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        if default.takes_self:
            return "computed"
        return toml_value(default.factory())
    return toml_value(default)


def constraints(validator: Any) -> list[str]:
    """Readable constraints of attrs' built-in validators; a custom validator's docstring, else ``custom check``."""
    if validator is None:
        return []
    name = type(validator).__name__
    if name == "_AndValidator":
        return [c for v in validator._validators for c in constraints(v)]
    if isinstance(validator, list | tuple):
        return [c for v in validator for c in constraints(v)]
    if name == "_NumberValidator":
        return [f"{validator.compare_op} {validator.bound}"]
    if name == "_InValidator":
        options = getattr(validator, "_original_options", validator.options)
        if isinstance(options, range) and options.step == 1:
            return [f">= {options.start}", f"<= {options.stop - 1}"]
        return ["one of " + ", ".join(toml_value(o) for o in options)]
    if name == "_MinLengthValidator":
        return [f"length >= {validator.min_length}"]
    if name == "_MaxLengthValidator":
        return [f"length <= {validator.max_length}"]
    if name == "_OptionalValidator":
        return [f"{c} or unset" for c in constraints(validator.validator)]
    doc = paragraphs(validator.__doc__) if inspect.isfunction(validator) else []
    if doc:  # a validator function's own summary
        return [markdown(doc[0]).rstrip(".")]
    return ["custom check"]


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


FIELD_COLUMNS = ("key", "type", "default", "constraint", "note")


def field_rows(config: type) -> list[tuple[str, str, str, str, str]]:
    """One row per config field: key, type, default (``**required**`` without one), constraints, note."""
    notes = field_comments(config)
    return [(f.name, field_type(config, f), field_default(f), ", ".join(constraints(f.validator)),
             notes.get(f.name, "")) for f in attrs.fields(config)]


def fields_table(config: type) -> list[str]:
    """The config's fields as a markdown table (docs/reference.md)."""
    rows = field_rows(config)
    if not rows:
        return ["No parameters."]
    out = ["| " + " | ".join(FIELD_COLUMNS) + " |", "| --- | --- | --- | --- | --- |"]
    for key, kind, default, constraint, note in rows:
        shown = default if default == "**required**" else f"`{default}`"
        row = [f"`{key}`", f"`{kind}`", shown, constraint, note]
        out.append("| " + " | ".join(cell(c) for c in row) + " |")
    return out


def part_text(kind: str, name: str, cls: Any) -> str:
    """What ``flowrl ls NAME`` prints: the part's class, summary, body and settings as plain text."""
    lines = [f"{kind} {name} ({cls.__module__}.{cls.__qualname__})"]
    for paragraph in paragraphs(cls.__doc__)[:2]:  # what it is, and how it works
        lines += ["", textwrap.fill(markdown(paragraph).replace("`", ""), width=110)]
    rows = field_rows(cls.Config)  # every registered part declares one (flowrl.core.registry checks it)
    lines += ["", "settings:" if rows else "settings: none"]
    if rows:
        width = max(len(key) for key, *_ in rows)
        for key, kind_, default, constraint, note in rows:
            detail = ", ".join(x for x in (constraint, note.replace("`", "")) if x)
            lines.append(f"  {key:<{width}}  {kind_} = {default.replace('**', '')}" + (f"  ({detail})" if detail
                                                                                      else ""))
    return "\n".join(lines)
