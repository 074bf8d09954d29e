"""The embedded world's verifier as a pairwise judge, so that a pairwise method (Pref-GRPO) runs and learns on the
CPU with a judge whose verdicts are known."""

from __future__ import annotations

import attrs
import torch
from attrs.validators import ge
from torch import Tensor

from flowrl.core.judges import PairwiseJudge
from flowrl.core.registry import register
from flowrl.world.components import WorldVerifier


@register("judge", "world_verifier")
class WorldVerifierJudge(PairwiseJudge):
    """Prefers the image with the higher world verifier score; scores within ``margin`` of each other tie.

    The verifier's score (the share of the prompt's constraints met, less one per extra object; ``strict``: 1 only
    when all are met and nothing is extra) of each image of the pair: the first wins (1) when its score is above
    the second's by more than ``margin``, loses (0) when below by more, else the pair ties (0.5).
    """

    @attrs.frozen
    class Config:
        strict: bool = False  # compare the strict 0/1 verdicts instead of the scores
        margin: float = attrs.field(default=0.0, validator=ge(0))  # score differences up to this tie

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.verifier = WorldVerifier(WorldVerifier.Config(strict=config.strict))

    def compare(self, first: Tensor, second: Tensor, prompts: list[str]) -> Tensor:
        a = self.verifier.score(first, prompts).double()
        b = self.verifier.score(second, prompts).double()
        margin = self.config.margin
        wins = torch.where(a - b > margin, 1.0, torch.where(b - a > margin, 0.0, 0.5))
        return wins.float()
