"""Rewards of video clips: an image reward scores a clip as the mean over some of its frames; a reward that
declares itself a video reward (``RewardModel.video = True``) gets the whole clip ``(B, F, 3, H, W)``.

Which frames: the reward's ``frames`` (a recipe's ``[[reward]] frames``: a count evenly spaced, a list of
indices, or ``"all"``; :func:`flowrl.utils.video.frame_indices`). Images ``(B, 3, H, W)`` pass through unchanged, so
every caller that scores a rollout's or an evaluation's pictures goes through these two functions.

Each call hands the reward its own copy of the pictures and prompts: a reward that changes its input in place
(``images.mul_(0)``) changes nothing another reward, the logged samples or a later evaluation sees.
"""

from __future__ import annotations

import torch
from torch import Tensor

from flowrl.core.group_rewards import GroupReward
from flowrl.core.interfaces import RewardModel
from flowrl.utils.video import frame_indices, is_clip


def _frames(model: RewardModel, clips: Tensor, prompts: list[str]) -> tuple[Tensor, list[str], int]:
    """The chosen frames of every clip as one image batch (clip-major), their prompts, and frames per clip."""
    chosen = frame_indices(clips.shape[1], getattr(model, "frames", None))
    b, k = clips.shape[0], len(chosen)
    images = clips[:, chosen].reshape(b * k, *clips.shape[2:])  # indexing with a list copies: the reward's own
    return images, [p for p in prompts for _ in range(k)], k


def score_pictures(model: RewardModel, images: Tensor, prompts: list[str], groups: Tensor | None = None) -> Tensor:
    """``model.score`` of images, of whole clips for a video reward, else the mean over each clip's frames.

    ``groups`` (one id per picture: ``Rollout.group``) goes to a group-wise reward
    (:class:`~flowrl.core.group_rewards.GroupReward`), which scores each group together; for the frames of clips,
    frame ``f`` of a group's clips is a group of its own, and a clip's score the mean over its frames."""
    if not is_clip(images) or model.video:
        if groups is not None and isinstance(model, GroupReward):
            return model.score_groups(images.clone(), list(prompts), groups)
        return model.score(images.clone(), list(prompts))
    frames, repeated, k = _frames(model, images, prompts)
    if groups is not None and isinstance(model, GroupReward):
        ids = torch.unique(groups.cpu(), return_inverse=True)[1]  # 0 .. n-1, so that id * k + frame is unique
        per_frame = ids.repeat_interleave(k) * k + torch.arange(k).repeat(images.shape[0])
        scores = model.score_groups(frames, repeated, per_frame)
    else:
        scores = model.score(frames, repeated)
    if not isinstance(scores, Tensor) or scores.shape != (frames.shape[0],):
        return scores  # the caller reports the wrong type or shape
    return scores.reshape(images.shape[0], k).mean(1)


def eval_pictures(model: RewardModel, images: Tensor, prompts: list[str]) -> dict[str, float]:
    """``model.eval_metrics`` of images or whole clips (a video reward), else of the clips' chosen frames with
    each clip's prompt: figures that are means over images become means over every chosen frame."""
    if not is_clip(images) or model.video:
        return model.eval_metrics(images.clone(), list(prompts))
    frames, repeated, _ = _frames(model, images, prompts)
    return model.eval_metrics(frames, repeated)
