"""Allowed values written once: a ``Literal`` type is both a setting's annotation and its validator.

``mode: Mode = attrs.field(default="a", validator=one_of(Mode))`` with ``Mode = Literal["a", "b"]``: the
reference (:mod:`flowrl.config.part_docs`) reads the type, the recipe check reads the validator, and both come
from the one list.
"""

from __future__ import annotations

import typing
from typing import Any

from attrs.validators import in_


def values(literal: Any) -> tuple[Any, ...]:
    """The values a ``Literal[...]`` type allows, in the order written."""
    allowed = typing.get_args(literal)
    if typing.get_origin(literal) is not typing.Literal or not allowed:
        raise TypeError(f"expected a Literal[...] type, got {literal!r}")
    return allowed


def one_of(literal: Any) -> Any:
    """An attrs validator accepting exactly the values of ``literal``."""
    return in_(values(literal))
