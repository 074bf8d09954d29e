"""Putting loaded state in place: a checkpoint's weights into a live module, a recipe's ``[optim]`` settings into a
loaded optimizer and LR schedule.

Both the trained policy (:mod:`~flowrl.trainer.policy`) and the checkpoint package
(:mod:`~flowrl.trainer.checkpoints`) use these, so they live below both: the checkpoint package imports the
policy, never the other way round.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from flowrl.core.errors import UserError
from flowrl.trainer.sharding import copy_full_into


class CheckpointError(UserError, ValueError):
    """A checkpoint that cannot be used (missing, truncated, from another model)."""


def load_weights_into(module: torch.nn.Module, weights: dict[str, Tensor], source: Path) -> None:
    """Copy ``weights`` into the named parameters of ``module``; every name and shape must match."""
    params = dict(module.named_parameters())
    fix = f"use the recipe the checkpoint was written with ({Path(source) / 'recipe.toml'})"
    unknown = sorted(set(weights) - set(params))
    if unknown:
        raise CheckpointError(f"checkpoint {source}: weights are from another model ('{unknown[0]}'); {fix}")
    absent = sorted(n for n, p in params.items() if p.requires_grad and n not in weights)
    if absent:  # a smaller model's weights would load only partly
        raise CheckpointError(f"checkpoint {source}: weights are from another model (no '{absent[0]}'); {fix}")
    for name, tensor in weights.items():
        if params[name].shape != tensor.shape:
            raise CheckpointError(
                f"checkpoint {source}: weights are from another model ('{name}' has shape {tuple(tensor.shape)},"
                f" this model's {tuple(params[name].shape)}); {fix}"
            )
        copy_full_into(params[name], tensor)


def apply_optim_settings(optimizer: Any, schedule: Any, lr: float, betas: tuple[float, float], eps: float,
                         weight_decay: float) -> None:
    """After loading a checkpoint's optimizer and LR-schedule states (which carry the settings they were made
    with), put the recipe's ``[optim]`` settings in force: a changed learning rate or Adam setting applies from
    the first resumed step. Unchanged settings give the same values, bit for bit."""
    schedule.base_lrs = [lr for _ in optimizer.param_groups]
    rates = [lr * factor(schedule.last_epoch) for factor in schedule.lr_lambdas]
    for group, rate in zip(optimizer.param_groups, rates, strict=True):
        group.update(lr=rate, betas=betas, eps=eps, weight_decay=weight_decay)
    schedule._last_lr = rates  # what get_last_lr() reports (torch has no public setter)
