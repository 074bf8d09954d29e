"""A lagged copy of the trained weights, for forward-process losses that measure the policy against an older
version of itself (``ForwardProcessLoss.lagged_decay``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from flowrl.core.interfaces import ForwardProcessLoss, Loss
from flowrl.trainer.ema import EMA


def wants_lagged(loss: Loss) -> bool:
    """Whether ``loss`` measures the policy against a lagged copy of itself (``ForwardProcessLoss.lagged_decay``)."""
    return isinstance(loss, ForwardProcessLoss) and loss.lagged_decay(0) is not None


def samples_from_lagged(loss: Loss) -> bool:
    """Whether the rollouts are sampled by that copy (``ForwardProcessLoss.samples_from_lagged``)."""
    return isinstance(loss, ForwardProcessLoss) and loss.samples_from_lagged()


class LaggedPolicy(EMA):
    """``old <- d old + (1 - d) theta`` after every optimizer step, ``d`` the loss's decay for the number of
    steps taken; starts as the initial weights and is checkpointed with the policy. :meth:`weights` puts the
    copy in the transformer for a no-gradient forward and restores the trained weights after it."""

    def __init__(self, named_params: list[tuple[str, nn.Parameter]]) -> None:
        super().__init__(named_params, decay=0.0)

    def blend(self, decay: float) -> None:
        """One blend towards the current weights with decay ``decay`` in [0, 1] (0 copies, 1 keeps the copy)."""
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"the lagged policy's decay must lie in [0, 1], got {decay}")
        self.decay = decay
        self.update()

    @torch.no_grad()
    def distance(self) -> float:
        """``||theta - old|| / ||old||`` over all trained parameters: how far the weights have moved ahead of the
        copy (0 when it follows them exactly). Logged as ``lagged/distance`` after each blend."""
        diff = sum(float((p.detach().float() - self.shadow[name].float()).square().sum()) for name, p in self.params)
        norm = sum(float(self.shadow[name].float().square().sum()) for name, _ in self.params)
        return (diff / norm) ** 0.5 if norm > 0 else 0.0

    @contextmanager
    def weights(self) -> Iterator[None]:
        """Inside: the transformer holds the lagged weights (call it without gradients, and before any forward
        whose graph a backward still needs: the swap writes the parameters in place)."""
        saved = [p.detach().clone() for _, p in self.params]
        with torch.no_grad():
            for name, p in self.params:
                p.copy_(self.shadow[name])
        try:
            yield
        finally:
            with torch.no_grad():
                for (_, p), kept in zip(self.params, saved, strict=True):
                    p.copy_(kept)
