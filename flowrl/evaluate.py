"""Deterministic (all-ODE) sampling and scoring: the evaluation used by ``flowrl eval`` and the trainer."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from flowrl.interfaces import Backbone, RewardError, RewardModel
from flowrl.samplers.walk import walk
from flowrl.types import Plan, Schedule


@torch.no_grad()
def ode_images(backbone: Backbone, prompts: list[str], schedule: Schedule, seed: int, batch: int = 64) -> Tensor:
    """Images for ``prompts`` by the deterministic ODE sampler; initial noise fixed by ``seed``."""
    plan = Plan(units=(), trained=())
    generator = torch.Generator().manual_seed(seed)
    out = []
    for start in range(0, len(prompts), batch):
        chunk = prompts[start : start + batch]
        cond = backbone.encode(chunk)
        x = backbone.noise(len(chunk), generator)
        rows = torch.arange(len(chunk))
        out.append(backbone.decode(walk(backbone, x, cond, rows, 0, plan, schedule, None)).cpu())
    return torch.cat(out)


@torch.no_grad()
def evaluate(
    backbone: Backbone,
    prompts: list[str],
    rewards: Sequence[tuple[str, float, RewardModel]],
    schedule: Schedule,
    seed: int = 0,
) -> dict[str, float]:
    """Each reward's evaluation figures on ODE samples (``name/score``, ...), and the NFE spent.

    With a single reward its figures also appear unprefixed (``score``, ``strict`` for the world).
    """
    nfe0 = backbone.nfe
    images = ode_images(backbone, prompts, schedule, seed)
    result: dict[str, float] = {}
    for name, _, model in rewards:
        try:
            figures = model.eval_metrics(images, prompts)
        except Exception as error:
            raise RewardError(
                f"reward '{name}' ({type(model).__name__}) failed: {type(error).__name__}: {error}"
            ) from error
        result.update({f"{name}/{key}": value for key, value in figures.items()})
        if len(rewards) == 1:
            result.update(figures)
    result["nfe"] = backbone.nfe - nfe0
    return result
