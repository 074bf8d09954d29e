"""What an attention-entropy probe measures (AEGPO's ``[selector.attention]`` table): a settings type with no
model code, so parts that only carry the settings import nothing heavy (the probe itself is
:mod:`flowrl.backbones.flux.probe`)."""

from __future__ import annotations

from typing import Any, Literal

import attrs
from attrs.validators import ge, gt

from flowrl.core.choices import one_of

Keys = Literal["all", "text"]


def _layers(value: Any) -> tuple[int, ...]:
    return tuple(int(v) for v in value)


def _non_negative(_: object, attribute: attrs.Attribute, value: tuple[int, ...]) -> None:
    if any(v < 0 for v in value):
        raise ValueError(f"'{attribute.name}' indices must be >= 0, got {list(value)}")


@attrs.frozen
class AttentionEntropyOptions:
    """What the probe measures; usable as a recipe sub-table (``[selector.attention]``)."""

    keys: Keys = attrs.field(default="all", validator=one_of(Keys))  # text: renormalised
    normalise: bool = False  # divide by log(key count): values in [0, 1]
    layers: tuple[int, ...] = attrs.field(default=(), converter=_layers, validator=_non_negative)  # () = all
    query_stride: int = attrs.field(default=1, validator=ge(1))  # every k-th image query row
    chunk_size: int = attrs.field(default=1024, validator=gt(0))  # query rows per explicit-softmax chunk
