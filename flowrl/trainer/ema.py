"""Exponential moving average of the trainable parameters."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from flowrl.trainer.sharding import copy_full_into, local


class EMA:
    """``ema <- decay * ema + (1 - decay) * param`` after every optimizer step."""

    def __init__(self, named_params: list[tuple[str, nn.Parameter]], decay: float) -> None:
        self.decay = decay
        self.params = named_params
        self.shadow = {name: p.detach().clone() for name, p in named_params}

    @torch.no_grad()
    def update(self) -> None:
        for name, p in self.params:
            self.shadow[name].lerp_(p.detach(), 1 - self.decay)

    def state_dict(self) -> dict[str, Tensor]:
        return dict(self.shadow)

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        for name, shadow in self.shadow.items():  # full tensors, or this process's slices of sharded ones
            if state[name].shape == shadow.shape:
                copy_full_into(shadow, state[name])
            else:
                local(shadow).copy_(state[name])
