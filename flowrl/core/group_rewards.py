"""Group-wise rewards: a reward that scores the images of one group together (a win rate among them), where a
pointwise :class:`~flowrl.core.interfaces.RewardModel` scores each image alone.

A group is the set of rollouts the advantage estimator normalises against, ``Rollout.group`` (the rollouts of one
prompt in one iteration; a (prompt, unit) pair for the shared-anchor sampler). The reward phase hands a group-wise
reward each group's images with the group's prompt, which carries its condition images where the task has any
(:mod:`flowrl.core.conditions`), and takes back one score per image in the order given. Everything after the
scores (weights and their schedules, ``multi_reward`` in every form, the logged figures) treats the scores as
any reward's: a group-wise reward composes with pointwise ones in the same recipe.

A caller that knows no groups (an evaluation, a suite, ``flowrl serve``) calls :meth:`GroupReward.score`: the images
that share a prompt are then one group. A group of one image has nothing to be compared with; what it scores is
the reward's choice (a win rate gives the neutral 0.5).
"""

from __future__ import annotations

from abc import abstractmethod

import torch
from torch import Tensor

from flowrl.core.contracts import refuses
from flowrl.core.interfaces import RewardModel


def groups_by_prompt(prompts: list[str]) -> Tensor:
    """One id per prompt, equal for equal prompts (text and condition images), numbered by first appearance."""
    seen: dict[str, int] = {}
    return torch.tensor([seen.setdefault(p, len(seen)) for p in prompts], dtype=torch.long)


class GroupReward(RewardModel):
    """A reward that scores the images of one group together: one score per image, in the order given.

    Subclasses define :meth:`score_group`. Registered as a ``reward`` like any other; the trainer's reward phase
    calls :meth:`score_groups` with the rollout's groups (docs/rewards.md, "Group-wise rewards").

    Where a sampler's groups are not the sets its estimator normalises, no group-wise score can be defined, and
    ``flowrl validate`` refuses the pair in one line (:attr:`requires`)."""

    requires = (
        refuses(
            "granular_rollouts",
            "each group holds every jump finished on several grids, and the estimator normalises each grid's images"
            " apart: a score over the whole group would set a jump against its own other finishes; use a sampler"
            " whose groups are the normalised sets (anchor_branch)",
        ),
    )

    @abstractmethod
    def score_group(self, images: Tensor, prompt: str) -> Tensor:
        """Scores ``(G,)`` for the ``G`` images ``(G, 3, H, W)`` in [0, 1] of one group, all made for ``prompt``
        (a :class:`~flowrl.core.conditions.Prompt` carries its condition images)."""

    def score_groups(self, images: Tensor, prompts: list[str], groups: Tensor) -> Tensor:
        """One score per image: the images sharing an id of ``groups`` ``(B,)`` scored together by
        :meth:`score_group`, each score back at its image's place. Every image of a group must have the same
        prompt (a ``ValueError`` otherwise: the group would have no one prompt to be judged against)."""
        if len(prompts) != images.shape[0] or tuple(groups.shape) != (images.shape[0],):
            raise ValueError(f"{images.shape[0]} images, {len(prompts)} prompts and {tuple(groups.shape)} group ids")
        out = torch.zeros(images.shape[0], dtype=torch.float32)
        for group in torch.unique(groups.cpu()):
            index = torch.nonzero(groups.cpu() == group).flatten()
            prompt = prompts[int(index[0])]
            if any(prompts[int(i)] != prompt for i in index):
                raise ValueError(f"group {int(group)} holds images of different prompts; a group-wise reward judges"
                                 " a group against one prompt")
            scores = self.score_group(images[index.to(images.device)], prompt)
            if not isinstance(scores, Tensor) or tuple(scores.shape) != (len(index),):
                shape = tuple(scores.shape) if isinstance(scores, Tensor) else type(scores).__name__
                raise ValueError(f"score_group returned {shape} for a group of {len(index)} images")
            out[index] = scores.detach().float().cpu()
        return out

    def score(self, images: Tensor, prompts: list[str]) -> Tensor:
        """Without group ids (an evaluation, a suite, a served reward): the images that share a prompt are a group."""
        return self.score_groups(images, list(prompts), groups_by_prompt(list(prompts)))
