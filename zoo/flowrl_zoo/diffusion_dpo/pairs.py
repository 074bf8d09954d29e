"""Preference pairs from a rollout's groups: which rollouts a Diffusion-DPO update compares."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

PairMode = Literal["best_worst", "all"]


def preference_rows(advantages: Tensor, prompt: Tensor, mode: PairMode, levels: int = 1) -> tuple[Tensor, Tensor]:
    """The loss rows of the pairs of each prompt's rollouts: ``(rollout, draw)`` with rows ``2k, 2k + 1`` the
    preferred and the rejected rollout of pair ``k`` and ``draw = k`` for both (one noise level and one noise per
    pair). Prompts in increasing row order; with ``levels = n`` each pair ``n`` times in a row, each copy its own draw.

    ``mode = "best_worst"``: one pair a prompt, the rollout of the highest advantage against the lowest (the first
    of each on ties). ``"all"``: every two rollouts of a prompt whose advantages differ, the higher one preferred.
    A pair whose advantages are equal is skipped (a prompt whose rollouts all tie gives none). Within a prompt a
    group-normalised advantage orders the rollouts as their rewards do, so this pairs by reward.
    """
    a = advantages.detach().float().cpu()
    prompt = prompt.cpu()
    chosen: list[int] = []
    rejected: list[int] = []
    for p in torch.unique(prompt).tolist():
        idx = (prompt == p).nonzero().flatten()
        values = a[idx]
        if mode == "best_worst":
            best, worst = int(idx[int(values.argmax())]), int(idx[int(values.argmin())])
            if a[best] > a[worst]:
                chosen.append(best)
                rejected.append(worst)
            continue
        for i in range(len(idx)):
            for j in range(i + 1, len(idx)):
                if values[i] == values[j]:
                    continue
                hi, lo = (i, j) if values[i] > values[j] else (j, i)
                chosen.append(int(idx[hi]))
                rejected.append(int(idx[lo]))
    rollout = torch.stack([torch.tensor(chosen, dtype=torch.long), torch.tensor(rejected, dtype=torch.long)], 1)
    rollout = rollout.repeat_interleave(levels, dim=0)
    return rollout.flatten(), torch.arange(rollout.shape[0]).repeat_interleave(2)
