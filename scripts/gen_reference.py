"""Write docs/reference.md from the registries: every registered component and the settings tables.

    python scripts/gen_reference.py          # (re)write docs/reference.md
    python scripts/gen_reference.py --check  # exit 1 if docs/reference.md is out of date

For each kind, in ``flowrl.KINDS`` order, every registered name (core and plugins such as the zoo) with
its one-line summary, the first paragraph of its docstring after that summary, and its config fields:
type, default, constraints (read from the attrs validators) and the field's source comment, if any.
The ``[schedule]``, ``[optim]``, ``[trainer]`` and ``[lora]`` tables follow. The output depends only on what is
registered.
"""

from __future__ import annotations

import argparse
import difflib
import inspect
import io
import json
import math
import re
import sys
import textwrap
import tokenize
import types
import typing
from pathlib import Path
from typing import Any

import attrs

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference.md"
INTERFACES = {
    "selector": "TimestepSelector",
    "sampler": "RolloutSampler",
    "advantage": "AdvantageEstimator",
    "reward": "RewardModel",
    "loss": "Loss",
    "kernel": "TransitionKernel",
    "backbone": "Backbone",
    "prompts": "PromptSource",
}


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
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
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


def fields_table(config: type) -> list[str]:
    fields = attrs.fields(config)
    if not fields:
        return ["No parameters."]
    notes = field_comments(config)
    out = ["| key | type | default | constraint | note |", "| --- | --- | --- | --- | --- |"]
    for f in fields:
        row = [
            f"`{f.name}`",
            f"`{field_type(config, f)}`",
            f"`{field_default(f)}`" if f.default is not attrs.NOTHING else field_default(f),
            ", ".join(constraints(f.validator)),
            notes.get(f.name, ""),
        ]
        out.append("| " + " | ".join(cell(c) for c in row) + " |")
    return out


# -- the page --------------------------------------------------------------------------------------------
def table_name(kind: str) -> str:
    return "[[reward]]" if kind == "reward" else f"[{kind}]"


def render() -> str:
    from flowrl.recipe import SETTING_TABLES
    from flowrl.registry import KINDS, registry

    lines = [
        "<!-- Generated by scripts/gen_reference.py from the registries. Do not edit by hand. -->",
        "# Reference",
        "",
        "Every component a recipe can name, by kind, and the settings tables. A component's keys go into",
        "its recipe table next to `type`; see [recipes.md](recipes.md). Regenerate this page with",
        "`python scripts/gen_reference.py`; `nox -s docs` fails when it is out of date.",
        "",
        "Kinds: " + ", ".join(f"[{k}](#{k})" for k in KINDS) + "; settings: "
        + ", ".join(f"[{k}](#{k}-table)" for k in SETTING_TABLES) + ".",
        "",
    ]
    for kind in KINDS:
        items = registry(kind).items()
        lines += [
            f"## {kind}",
            "",
            f"Interface `flowrl.{INTERFACES.get(kind, '?')}`; recipe table `{table_name(kind)}`.",
            "",
        ]
        if kind == "reward":
            lines += [
                "Every `[[reward]]` table also takes `weight` (float, default `1.0`) and `name` (string,",
                "default: the type); the total reward is the weighted sum.",
                "",
            ]
        lines += ["| type | summary |", "| --- | --- |"]
        lines += [f"| [`{name}`](#{name}) | {cell(summary_and_body(cls)[0])} |" for name, cls in items]
        lines.append("")
        for name, cls in items:
            head, body = summary_and_body(cls)
            lines += [f"### `{name}`", "", f"`{cls.__module__}.{cls.__qualname__}`. {head}", ""]
            if body:
                lines += [body, ""]
            lines += [*fields_table(cls.Config), ""]  # type: ignore[attr-defined]
    for table, config in SETTING_TABLES.items():
        head, body = summary_and_body(config)
        lines += [f"## {table} table", "", head, ""]
        if body:
            lines += [body, ""]
        lines += [*fields_table(config), ""]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/reference.md is out of date")
    args = parser.parse_args(argv)
    text = render()
    rel = REFERENCE.relative_to(ROOT)
    if args.check:
        current = REFERENCE.read_text(encoding="utf-8") if REFERENCE.exists() else ""
        if current == text:
            return 0
        diff = list(difflib.unified_diff(current.splitlines(), text.splitlines(), str(rel), "generated", lineterm=""))
        print(f"{rel} is out of date with the registries; run: python scripts/gen_reference.py")
        print("\n".join(diff[:40] + (["..."] if len(diff) > 40 else [])))
        return 1
    REFERENCE.parent.mkdir(parents=True, exist_ok=True)
    REFERENCE.write_text(text, encoding="utf-8")
    print(f"wrote {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
