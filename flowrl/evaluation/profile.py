"""The timestep profile: how much the final reward varies when only one step of sampling is stochastic.

For each step ``i`` of a recipe's schedule, ``G`` samples per prompt start from the *same* initial noise
and run ODE steps everywhere except step ``i``, which is an SDE step of the recipe's kernel. The spread
(standard deviation within a prompt's group) of the final reward then measures how much exploring at
step ``i`` can change the outcome: where it is zero, a group-normalised method learns nothing from that
step. Methods that choose timesteps (E-GRPO, MixGRPO, TempFlow-GRPO, BranchGRPO, AEGPO) can only differ
where this profile is uneven.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from flowrl.core.interfaces import Backbone
from flowrl.core.types import Plan, RewardBatch, Schedule, Unit
from flowrl.evaluation.evaluate import sample_images
from flowrl.parts.entropy import jump_std
from flowrl.rewards.built import BuiltReward
from flowrl.rewards.frames import score_pictures


@torch.no_grad()
def one_step_images(
    backbone: Backbone, prompts: list[str], schedule: Schedule, step: int, group: int, seed: int, batch: int = 64
) -> torch.Tensor:
    """``group`` images per prompt (prompt-major): shared initial noise per prompt, SDE at ``step`` only."""
    noise = backbone.noise(len(prompts), torch.Generator().manual_seed(seed)).repeat_interleave(group, 0)
    repeated = [p for p in prompts for _ in range(group)]
    plan = Plan(units=(Unit(step),), trained=())
    return sample_images(backbone, repeated, schedule, seed, plan, batch, initial=noise, iteration=step)


def reward_profile(
    backbone: Backbone,
    prompts: list[str],
    rewards: Sequence[BuiltReward],
    schedule: Schedule,
    group: int,
    seed: int = 0,
    progress: Any = None,
) -> list[dict[str, float]]:
    """One row per step: ``step``, ``sigma``, the kernel's ``std``, the mean within-group ``spread`` of the
    weighted reward and the share of groups whose reward is not constant (``nonzero``)."""
    repeated = [p for p in prompts for _ in range(group)]
    weights = {r.name: r.weight for r in rewards}
    rows = []
    for i in range(schedule.num_steps):
        images = one_step_images(backbone, prompts, schedule, i, group, seed)
        scores = {r.name: score_pictures(r.model, images, repeated).double() for r in rewards}
        spread = RewardBatch(scores=scores, weights=weights).total.reshape(len(prompts), group).numpy().std(axis=1)
        rows.append(
            {
                "step": i,
                "sigma": float(schedule.sigmas[i]),
                "std": jump_std(schedule, i, 1),
                "spread": float(spread.mean()),
                "nonzero": float((spread > 1e-9).mean()),
            }
        )
        if progress is not None:
            progress.update(1)
    return rows


def front_to_back(rows: list[dict[str, float]]) -> float:
    """Mean spread of the first third of the steps over that of the last third (inf when the last is 0)."""
    third = max(1, len(rows) // 3)
    first = float(np.mean([r["spread"] for r in rows[:third]]))
    last = float(np.mean([r["spread"] for r in rows[-third:]]))
    return first / last if last > 0 else float("inf")


def format_profile(rows: list[dict[str, float]]) -> str:
    lines = [f"{'step':>4}  {'sigma':>6}  {'std':>6}  {'spread':>7}  {'nonzero':>7}"]
    for r in rows:
        lines.append(
            f"{int(r['step']):>4}  {r['sigma']:>6.3f}  {r['std']:>6.3f}  {r['spread']:>7.4f}  {r['nonzero']:>7.2f}"
        )
    return "\n".join(lines)


def plot_profile(rows: list[dict[str, float]], path: Path, title: str) -> None:
    """Reward spread per step (bars) with the kernel's std (line, right axis)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [int(r["step"]) for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(steps, [r["spread"] for r in rows], color="tab:blue", alpha=0.7, label="reward spread")
    ax.set_xlabel("step perturbed (SDE), all others ODE")
    ax.set_ylabel("within-group std of the final reward")
    twin = ax.twinx()
    twin.plot(steps, [r["std"] for r in rows], color="tab:red", marker="o", ms=3, label="kernel std")
    twin.set_ylabel("kernel std", color="tab:red")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
