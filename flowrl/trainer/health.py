"""Signals of a run's health, computed every iteration from what the rollout already holds (no extra model call).

Reward hacking and lost exploration show in the samples before they show in the evaluation: a policy that
collapses onto one image per prompt, or whose groups all score alike, stops learning. Two cheap signals
catch both:

- ``health/diversity``: within each group, the root-mean-square pixel distance between two of its images
  (images in [0, 1], average-pooled to at most 64 x 64 so a 1024 px rollout costs no more than a small
  one), averaged over the group's pairs, then over groups. 0 when every group is one image repeated.
- ``health/zero_spread``: the share of groups whose advantages are all zero (within 1e-6). Such a group adds
  nothing to the policy gradient. With a group-normalised estimator these are the groups whose rewards are all
  equal; counting advantages rather than rewards keeps the figure right where they differ (rewards normalised
  one by one before a weighted sum, or a baseline that is not the group's mean).

:class:`HealthAlerts` turns them, and the evaluations, into warnings.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch
from torch import Tensor

POOLED = 64  # side of the images the distance is measured on
ZERO = 1e-6  # advantages within this of 0 count as zero


def rollout_health(images: Tensor, group: Tensor, advantages: Tensor) -> dict[str, float]:
    """``health/diversity`` and ``health/zero_spread`` of one rollout batch.

    ``images`` (R, 3, H, W) in [0, 1]; ``group`` (R,) the group id of each image; ``advantages`` (R,) its
    advantage. Groups of one image count for neither figure."""
    pixels, advantages = images.detach().float().cpu(), advantages.detach().float().cpu()
    if max(pixels.shape[-2:]) > POOLED:
        pixels = torch.nn.functional.adaptive_avg_pool2d(pixels, POOLED)
    flat = pixels.flatten(1)
    distances, flat_groups = [], 0
    for g in torch.unique(group):
        members = (group == g).nonzero().flatten()
        if len(members) < 2:
            continue
        x = flat[members]
        pair = torch.cdist(x, x) / x.shape[1] ** 0.5  # RMS distance per pixel value
        n = len(members)
        distances.append(float(pair.sum()) / (n * (n - 1)))  # the diagonal is 0
        flat_groups += int(float(advantages[members].abs().max()) <= ZERO)
    if not distances:
        return {}
    return {"health/diversity": sum(distances) / len(distances), "health/zero_spread": flat_groups / len(distances)}


@attrs.define
class HealthAlerts:
    """Two warnings of reward hacking, each a one-line message and a flag in the metrics.

    - ``alert/diversity``: ``health/diversity`` fell below ``diversity_share`` of its first value (the
      policy is collapsing onto one image per prompt).
    - ``alert/reward_vs_eval``: over the last ``eval_falls`` evaluations the evaluation figure fell each
      time while the mean training reward since the previous evaluation rose each time (the policy is
      learning the training reward, not the task).

    A setting of 0 turns its alert off. Each alert prints once when it starts and again only after it has
    cleared; the flag is in every row where the condition holds.
    """

    diversity_share: float = 0.5
    eval_falls: int = 3
    first_diversity: float | None = None
    window: list[float] = attrs.field(factory=list)  # training rewards since the last evaluation
    history: list[tuple[float, float]] = attrs.field(factory=list)  # (mean training reward, evaluation figure)
    hacking: bool = False  # the reward-vs-evaluation condition, as of the last evaluation
    active: set[str] = attrs.field(factory=set)

    def observe(self, metrics: dict[str, Any], figure: tuple[str, float] | None) -> list[str]:
        """Update from one iteration's ``metrics`` (flags are added to it) and the evaluation ``figure`` of this
        iteration (its key and value, or None); returns the warnings that start now."""
        messages: dict[str, str] = {}
        diversity = metrics.get("health/diversity")
        if self.diversity_share > 0 and isinstance(diversity, float):
            if self.first_diversity is None:
                self.first_diversity = diversity
            elif diversity < self.diversity_share * self.first_diversity:
                messages["alert/diversity"] = (
                    f"within-group diversity {diversity:.4f} is below {self.diversity_share:g} x its first value "
                    f"{self.first_diversity:.4f}: the samples are collapsing (look at them)"
                )
        if isinstance(metrics.get("reward/total"), float):
            self.window.append(metrics["reward/total"])
        if figure is not None and self.window:
            self.history.append((sum(self.window) / len(self.window), figure[1]))
            self.window = []
            recent = self.history[-(self.eval_falls + 1) :]
            pairs = list(zip(recent, recent[1:], strict=False))
            self.hacking = self.eval_falls > 0 and len(pairs) == self.eval_falls
            self.hacking = self.hacking and all(b[0] > a[0] and b[1] < a[1] for a, b in pairs)
            if self.hacking:
                messages["alert/reward_vs_eval"] = (
                    f"the training reward rose and {figure[0]} fell over the last {self.eval_falls} evaluations "
                    f"({recent[0][1]:.4f} -> {recent[-1][1]:.4f}): a sign of reward hacking (look at the samples)"
                )
        elif self.hacking:
            messages["alert/reward_vs_eval"] = ""  # holds until the next evaluation says otherwise
        started = [message for key, message in messages.items() if key not in self.active]
        self.active = set(messages)
        metrics.update({key: 1 for key in messages})
        return started
