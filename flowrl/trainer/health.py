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

    ``images`` (R, 3, H, W) in [0, 1] (or clips (R, F, 3, H, W)); ``group`` (R,) the group id of each image;
    ``advantages`` (R,) its advantage. Groups of one image count for neither figure."""
    pixels, advantages = images.detach().float().cpu(), advantages.detach().float().cpu()
    if pixels.dim() == 5:  # clips (R, F, 3, H, W): every frame's pixels count
        pixels = pixels.flatten(1, 2)
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

    - ``alert/diversity``: the mean ``health/diversity`` of the last ``diversity_window`` iterations fell
      below ``diversity_share`` of its mean over the run's first ``diversity_window`` iterations (the policy
      is collapsing onto one image per prompt). Means, because one iteration's figure comes from a few
      groups: on the embedded world with 2 prompts an iteration it moves by +-20% between iterations.
    - ``alert/reward_vs_eval``: over the last ``eval_falls`` evaluations the evaluation figure fell each
      time while the mean training reward since the previous evaluation rose each time (the policy is
      learning the training reward, not the task).

    A setting of 0 turns its alert off. Each alert prints once when it starts and again only after it has
    cleared; the flag is in every row where the condition holds.
    """

    diversity_share: float = 0.7
    eval_falls: int = 3
    diversity_window: int = 5
    baseline: list[float] = attrs.field(factory=list)  # the first diversity_window diversities
    recent: list[float] = attrs.field(factory=list)  # the last diversity_window diversities
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
            n = self.diversity_window
            if len(self.baseline) < n:
                self.baseline.append(diversity)
            self.recent = [*self.recent, diversity][-n:]
            start, now = sum(self.baseline) / len(self.baseline), sum(self.recent) / len(self.recent)
            if len(self.baseline) == n and now < self.diversity_share * start:
                over = f"over the last {n} iterations" if n > 1 else "now"
                messages["alert/diversity"] = (
                    f"within-group diversity {now:.4f} ({over}) is below {self.diversity_share:g} x its value "
                    f"at the start, {start:.4f}: the samples are collapsing (look at them)"
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
