"""The composition check of validate: every part's ``requires`` against what the recipe's parts ``provides``.

:func:`composition_checks`, run by every recipe load (``recipe.cross_checks``), collects every part's tokens
(:mod:`flowrl.core.contracts`) and reports each unmet need as one ``(table, message)`` line naming the part, the part
it refuses (or that no part provides what it needs), why, and the registered parts that provide it.
docs/composition.md lists what this decides for every pair of registered parts.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Protocol

from flowrl.core.contracts import describe, provided, required


class ChosenPart(Protocol):
    """What the check reads of a recipe's part (:class:`flowrl.config.recipe.Part`): its registered name, class and
    settings."""

    @property
    def type(self) -> str: ...
    @property
    def cls(self) -> Any: ...
    @property
    def config(self) -> Any: ...


def composition_checks(recipe_parts: Mapping[str, ChosenPart]) -> Iterator[tuple[str, str]]:
    """One ``(table, message)`` per unmet need of any of a recipe's parts, by table (see the module docstring)."""
    parts = list(recipe_parts.items())
    tokens = {table: provided(part.cls, part.config) for table, part in parts}
    everything = frozenset().union(*tokens.values())
    for table, part in parts:
        name = f"{table} '{part.type}'"
        for need in required(part.cls, part.config):
            if need.when is not None and need.when not in everything:
                continue
            others = [f"{t} '{p.type}'" for t, p in parts if t != table and need.token in tokens[t]]
            context = f" with {describe(need.when)}" if need.when is not None else ""
            if need.present and not others and need.token not in tokens[table]:
                able = providers(need.token)
                hint = f" (provided by: {', '.join(able)})" if able else ""
                yield table, f"{name}{context} needs {describe(need.token)}, which no part provides: {need.why}{hint}"
            elif not need.present and others:
                yield table, f"{name}{context} cannot take {describe(need.token)}, which {others[0]} gives: {need.why}"


def providers(token: str, kinds: Iterable[str] = ("selector", "sampler", "advantage", "loss")) -> list[str]:
    """Registered parts that provide ``token`` with their default settings, as ``kind 'name'``."""
    from flowrl.core.registry import registry

    found = []
    for kind in kinds:
        for name, cls in registry(kind).items():
            part: Any = cls  # a registered class: it has a Config (flowrl.core.registry checks)
            try:
                config = part.Config()
            except Exception:  # a part without defaults for every field: not listed
                continue
            if token in provided(cls, config):
                found.append(f"{kind} '{name}'")
    return found
