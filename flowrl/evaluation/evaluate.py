"""Evaluation sampling and scoring, used by ``flowrl eval`` and the trainer: deterministic (all-ODE) samples
for the scores, and optionally ``G`` stochastic samples per prompt for pass@1 / pass@G."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from flowrl.core.errors import part_failure
from flowrl.core.interfaces import Backbone, RewardError, RewardModel
from flowrl.core.rng import RolloutRNG
from flowrl.core.types import Plan, Schedule, Unit
from flowrl.parts.samplers.walk import walk
from flowrl.rewards.built import BuiltReward
from flowrl.rewards.frames import eval_pictures

STREAM_CHUNK = 64  # rows sampled together, and the chunks initial noise is drawn in from one generator


@torch.no_grad()
def ode_images(
    backbone: Backbone, prompts: list[str], schedule: Schedule, seed: int, batch: int = STREAM_CHUNK
) -> Tensor:
    """Images for ``prompts`` by the deterministic ODE sampler; initial noise fixed by ``seed``."""
    return sample_images(backbone, prompts, schedule, seed, Plan(units=(), trained=()), batch)


@torch.no_grad()
def sde_images(backbone: Backbone, prompts: list[str], schedule: Schedule, seed: int, batch: int = 64) -> Tensor:
    """Images for ``prompts`` with the schedule's SDE kernel on every step (one independent noise stream
    per row, fixed by ``seed``): the stochastic samples pass@G is measured on."""
    units = tuple(Unit(i) for i in range(schedule.num_steps))
    return sample_images(backbone, prompts, schedule, seed, Plan(units=units, trained=()), batch)


def sample_images(
    backbone: Backbone,
    prompts: list[str],
    schedule: Schedule,
    seed: int,
    plan: Plan,
    batch: int = 64,
    initial: Tensor | None = None,
    iteration: int = 0,
) -> Tensor:
    """Images for ``prompts`` walked down ``schedule`` with ``plan``'s SDE units, ``batch`` rows at a time.

    The initial noise is ``initial`` (one row per prompt) or drawn chunk by chunk from ``seed``; SDE noise
    comes from one generator per row, keyed by ``seed``, ``iteration`` and the row's index.
    """
    generator = torch.Generator().manual_seed(seed)
    out = []
    for start in range(0, len(prompts), batch):
        chunk = prompts[start : start + batch]
        cond = backbone.encode(chunk)
        x = backbone.noise(len(chunk), generator) if initial is None else initial[start : start + len(chunk)]
        rows = torch.arange(len(chunk))
        rng = RolloutRNG(seed, iteration, range(start, start + len(chunk))) if plan.units else None
        out.append(backbone.decode(walk(backbone, x, cond, rows, 0, plan, schedule, rng)).cpu())
    return torch.cat(out)


def _figures(name: str, model: RewardModel, images: Tensor, prompts: list[str]) -> dict[str, float]:
    try:
        return eval_pictures(model, images, prompts)  # a clip: over its chosen frames (or the clip)
    except (Exception, SystemExit) as error:  # sys.exit() in a reward is its failure, not the evaluation's end
        raise RewardError(f"reward '{name}' ({type(model).__name__}) failed: {part_failure(error)}") from error


def pass_at(
    backbone: Backbone, prompts: list[str], model: tuple[str, RewardModel], schedule: Schedule, group: int, seed: int
) -> dict[str, float]:
    """``pass_at_1`` and ``pass_at_G``: of ``group`` SDE samples per prompt, the mean share that pass and the
    share of prompts with at least one pass. A sample passes when the reward's ``strict`` figure for it is 1;
    rewards without a ``strict`` figure give no pass rates (an empty dict)."""
    name, reward = model
    repeated = [p for p in prompts for _ in range(group)]
    images = sde_images(backbone, repeated, schedule, seed)
    passed = []
    for image, prompt in zip(images, repeated, strict=True):
        figures = _figures(name, reward, image[None], [prompt])
        if "strict" not in figures:
            return {}
        passed.append(figures["strict"] >= 1.0)
    table = np.asarray(passed, dtype=np.float64).reshape(len(prompts), group)
    return {"pass_at_1": float(table.mean()), f"pass_at_{group}": float(table.max(axis=1).mean())}


@torch.no_grad()
def evaluate(
    backbone: Backbone,
    prompts: list[str],
    rewards: Sequence[BuiltReward],
    schedule: Schedule,
    seed: int = 0,
    group: int = 0,
) -> dict[str, float]:
    """Each reward's evaluation figures on ODE samples (``name/score``, ...), the prompt count and the NFE
    spent; with ``group > 0`` also pass@1 and pass@``group`` of the first reward (see :func:`pass_at`).

    With a single reward its figures also appear unprefixed (``score``, ``strict`` for the world).
    """
    nfe0 = backbone.nfe
    images = ode_images(backbone, prompts, schedule, seed)
    result: dict[str, float] = {}
    for reward in rewards:
        figures = _figures(reward.name, reward.model, images, prompts)
        result.update({f"{reward.name}/{key}": value for key, value in figures.items()})
        if len(rewards) == 1:
            result.update(figures)
    if group > 0 and rewards:
        result.update(pass_at(backbone, prompts, (rewards[0].name, rewards[0].model), schedule, group, seed))
    result["prompts"] = len(prompts)
    result["nfe"] = backbone.nfe - nfe0
    return result
