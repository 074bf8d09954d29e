"""The embedded world's edit suite: the held-out edits of the ``world_edit`` prompt source (250 by default, the edit
kinds in turn, each with its rendered source image) scored by the edit verifier: ``flowrl eval``'s figures on the
edit world, as the ``world`` suite gives them on the text-to-image world."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import attrs
import numpy as np
from attrs.validators import gt
from torch import Tensor

from flowrl.core.choices import one_of
from flowrl.core.conditions import conditions_of
from flowrl.core.registry import register
from flowrl.suites.interface import Item, Suite
from flowrl.suites.protocol import Protocol

Split = Literal["test", "novel", "train"]


@register("suite", "world_edit")
class WorldEditSuite(Suite):
    """The edit world's held-out edits (a source image and an instruction each) scored by its edit verifier."""

    primary = "strict"
    fractions = ("strict", "score", "follow", "preserve")
    lossless = True  # the verifier reads float images, as flowrl eval scores them
    source = "flowrl's embedded edit world (docs/editing.md): the held-out edits of the world_edit prompt source"

    @attrs.frozen
    class Config:
        split: Split = attrs.field(default="test", validator=one_of(Split))
        count: int = attrs.field(default=1000, validator=gt(0))  # the edit quickstart's held-out edits

    def protocol(self) -> Protocol:
        # flowrl eval's: 16 ODE steps at shift 3, the base's 32 px, one stream of noise from seed 0
        return Protocol(steps=16, images=1, seed=0, shift=3.0, noise="stream")

    def items(self) -> list[Item]:
        from flowrl.world.edit import parse_instruction
        from flowrl.world.edit_components import WorldEditPrompts

        config = WorldEditPrompts.Config(eval_split=self.config.split, eval_count=self.config.count)
        # each item's prompt carries its source image: generation hands it to the base, scoring to the verifier
        return [Item(p, parse_instruction(str(p)).kind) for p in WorldEditPrompts(config).heldout()]

    def score(self, images: Tensor, items: Sequence[Item]) -> list[dict[str, float]]:
        from flowrl.world.edit_verify import verify_edit_batch

        sources = np.stack([conditions_of(item.prompt)[0].pixels for item in items])
        verdicts = verify_edit_batch(images.detach().float().cpu(), sources, [str(item.prompt) for item in items])
        return [{"strict": float(v.strict), "score": float(v.score), "follow": v.follow_score,
                 "preserve": v.preserve_score} for v in verdicts]
