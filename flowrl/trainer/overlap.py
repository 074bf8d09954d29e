"""Scoring one chunk of an iteration's rollouts while the next chunk is rolled out (``trainer.overlap_chunks``).

A slow reward (a served model, a judge behind HTTP) otherwise leaves the transformer idle while it scores. With
``overlap_chunks = K`` the iteration's prompts are split into K chunks rolled out one after another by the
recipe's own sampler; as soon as chunk k's images exist, a background thread scores them while chunk k+1 is
generated. The rollout the loop sees is the chunks joined, and the loop's reward phase asks the sampler for the
scores already computed (:meth:`flowrl.core.interfaces.RolloutSampler.precomputed_scores`: the wrapper answers for
exactly the joined images and for nothing else, any other sampler with None).

Which samplers: those declaring their prompts independent of each other
(:attr:`flowrl.core.interfaces.RolloutSampler.chunkable`: the ``independent`` sampler and its subclasses unless they
say otherwise), with rollouts of images, no per-method ``extras`` and one group size for all prompts; any other
sampler, or ``overlap_chunks`` 0 or 1, runs exactly as without this module. Nothing here looks at a sampler's
class: a new sampler declares ``chunkable`` and needs no change in this module or the loop. Each prompt
keeps its own random stream (:class:`flowrl.core.rng.RolloutRNG`), so the chunked rollout draws the same noise;
the transformer sees smaller batches, so values can differ from the unchunked run in the last bits.
"""

from __future__ import annotations

import copy
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import attrs
import torch
from torch import Tensor

from flowrl.core.interfaces import RolloutSampler
from flowrl.core.rng import RolloutRNG
from flowrl.core.types import Conditioning, Plan, Rollout, Schedule, Transitions
from flowrl.rewards.built import BuiltReward
from flowrl.rewards.frames import score_pictures


def chunkable(sampler: RolloutSampler) -> bool:
    """Whether the sampler's prompts can be rolled out in separate calls (no prompt depends on another): its
    own declaration, :attr:`flowrl.core.interfaces.RolloutSampler.chunkable`."""
    return bool(sampler.chunkable)


def overlapped(sampler: RolloutSampler, rewards: list[BuiltReward], chunks: int) -> RolloutSampler:
    """``sampler`` itself when overlap is off or not possible; else the chunking wrapper, which scores each
    chunk with ``rewards`` (the reward phase then takes its :meth:`OverlappedSampler.precomputed_scores`)."""
    if chunks <= 1 or not chunkable(sampler):
        return sampler
    return OverlappedSampler(sampler, rewards, chunks)


def join(parts: list[Rollout]) -> Rollout:
    """One rollout of the chunks' rollouts, with every index re-based (prompts, groups, rollouts)."""
    prompts_seen = rollouts_seen = groups_seen = 0
    transitions = []
    rollout_prompt, group = [], []
    for part in parts:
        t = part.transitions
        transitions.append(attrs.evolve(t, input_cond=t.input_cond + prompts_seen,
                                        rollout_index=t.rollout_index + rollouts_seen))
        rollout_prompt.append(part.rollout_prompt + prompts_seen)
        group.append(part.group + groups_seen)
        prompts_seen += len(part.prompts)
        rollouts_seen += part.num_rollouts
        groups_seen += int(part.group.max()) + 1 if part.group.numel() else 0
    cond = Conditioning({k: torch.cat([p.cond.tensors[k] for p in parts]) for k in parts[0].cond.tensors})
    finals = [p.final_latents for p in parts]
    return Rollout(
        prompts=[p for part in parts for p in part.prompts],
        cond=cond,
        images=torch.cat([p.images for p in parts]),
        rollout_prompt=torch.cat(rollout_prompt),
        group=torch.cat(group),
        transitions=Transitions.concat(transitions),
        nfe=sum(p.nfe for p in parts),
        final_latents=torch.cat(finals) if all(f is not None for f in finals) else None,  # type: ignore[arg-type]
    )


class OverlappedSampler(RolloutSampler):
    """The recipe's sampler, called once per chunk of prompts; each chunk's images scored in a background thread."""

    def __init__(self, inner: RolloutSampler, rewards: list[BuiltReward], chunks: int) -> None:
        super().__init__(inner.config)
        self.inner, self.rewards, self.chunks = inner, rewards, chunks
        self.registered_name, self.needs_reference = inner.registered_name, inner.needs_reference
        self.images: Tensor | None = None  # the joined images of the last rollout
        self.pending: list[Future[dict[str, Tensor]]] = []  # per chunk: every reward's scores
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flowrl-score")

    def rollout_count(self, plan: Plan, num_prompts: int) -> int:
        return self.inner.rollout_count(plan, num_prompts)

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)

    def _score(self, part: Rollout) -> dict[str, Tensor]:
        texts = part.rollout_texts()
        return {r.name: score_pictures(r.model, part.images, texts, part.group) for r in self.rewards}

    def rollout(self, backbone: Any, prompts: list[str], plan: Plan, schedule: Schedule, rng: RolloutRNG) -> Rollout:
        self.wait()
        n = len(prompts)
        if n < 2 or plan.group_sizes is not None:
            return self.inner.rollout(backbone, prompts, plan, schedule, rng)
        k = min(self.chunks, n)
        bounds = [(i * n // k, (i + 1) * n // k) for i in range(k)]
        parts = []
        for a, b in bounds:
            part_rng = copy.copy(rng)
            part_rng.generators = rng.generators[a:b]  # each prompt keeps its own stream
            part = self.inner.rollout(backbone, prompts[a:b], plan, schedule, part_rng)
            if part.extras:
                self.wait()
                raise ValueError(f"trainer.overlap_chunks: sampler '{self.registered_name}' returns extras "
                                 f"({', '.join(part.extras)}), which chunks cannot join; set overlap_chunks = 0")
            parts.append(part)
            self.pending.append(self.pool.submit(self._score, part))
        rollout = join(parts)
        self.images = rollout.images
        return rollout

    def precomputed_scores(self, reward: str, images: Tensor) -> Tensor | None:
        """The precomputed scores of ``reward`` for ``images`` (the last joined rollout's), else None. The
        first chunk that failed raises its error here, in the loop's reward phase."""
        if images is not self.images or not self.pending:
            return None
        return torch.cat([future.result()[reward].float().cpu() for future in self.pending])

    def wait(self) -> None:
        """Let every background scoring finish (errors are dropped here; :meth:`precomputed_scores` reports them)."""
        for future in self.pending:
            future.exception()
        self.pending, self.images = [], None
