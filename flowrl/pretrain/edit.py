"""Pre-training the world's edit base (``task = "edit"``): flow matching on (source, instruction, target) triples.

The model is the world's edit backbone (:class:`~flowrl.world.edit_base.WorldEdit`: the pixel-space tiny FLUX
with the source image's tokens appended to its sequence) over the tokenizer of
:func:`~flowrl.world.edit.edit_vocabulary` (the world's words and the instruction words). Each step draws
``batch_size`` edits of the ``"train"`` and ``"test"`` edit splits (never ``"novel"``: a held-out colour-shape pair
or colour change), renders each as a source and target pair (:func:`~flowrl.world.edit_render.render_edit`), and
regresses the velocity at the noised *target* on ``eps - x0``, the source's tokens given clean through the prompt's
condition, exactly as RL's rollouts give them (:meth:`WorldEdit.encode` and :meth:`WorldEdit.velocity`, the very
calls sampling makes). A recipe with ``init`` (the text-to-image base, which already draws scenes) starts there;
rows of the text encoders' embeddings are carried over word by word, the instruction words start fresh
(:func:`~flowrl.pretrain.model.load_initial_weights`).

Evaluation is the edit verifier's on ODE samples of balanced test- and novel-split edits: ``test/score``,
``test/strict``, ``test/strict/<kind>``, ``test/follow``, ``test/preserve``, and the same for ``novel``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from flowrl.backbones.flux.adapter import pack_pixels
from flowrl.core.conditions import Condition, Prompt, conditions_of
from flowrl.core.types import Conditioning
from flowrl.pretrain.trainer import EvalSplit, Pretrainer
from flowrl.world.edit import EDIT_KINDS, Edit, sample_edits
from flowrl.world.grammar import PRETRAIN_SPLITS


def pretrain_edits(n: int, seed: int) -> list[Edit]:
    """``n`` edits of the pre-training splits, each split in turn (train, test, ...), each split's edits with their
    kind drawn uniformly: deterministic given ``seed``."""
    per = [sample_edits(split, n // len(PRETRAIN_SPLITS) + 1, seed + k) for k, split in enumerate(PRETRAIN_SPLITS)]
    return [per[i % len(per)][i // len(per)] for i in range(n)]


def render_triples(edits: list[Edit], seed: int, size: int, start: int = 0) -> list[tuple[Prompt, np.ndarray]]:
    """Each edit as its prompt (the instruction with the source image) and its target image (uint8)."""
    from flowrl.world.edit_render import render_edit_batch

    sources, targets = render_edit_batch(edits, seed, size, start)
    return [(Prompt(e.text, [Condition(s)]), t) for e, s, t in zip(edits, sources, targets, strict=True)]


class EditPretrainer(Pretrainer):
    """Flow-matching pre-training of the world's edit base; the loop, optimiser, EMA and saving are
    :class:`~flowrl.pretrain.trainer.Pretrainer`'s."""

    def render_pool(self) -> None:
        """Render ``pool_size`` (source, instruction, target) triples of the train and test edit splits once."""
        triples = render_triples(pretrain_edits(self.cfg.pool_size, self.recipe.seed), self.recipe.seed, self.size)
        self.pool = torch.from_numpy(np.stack([t for _, t in triples])).permute(0, 3, 1, 2).contiguous()
        self.pool_prompts = [p for p, _ in triples]

    @property
    def size(self) -> int:
        return self.recipe.model.image_size

    def batch(self, step: int) -> tuple[torch.Tensor, list[str]]:
        """Targets ``(B, 3, H, W)`` in [0, 1] and their prompts (instructions carrying their source images)."""
        if self.pool is not None:
            return super().batch(step)
        seed = self.recipe.seed * 1_000_003 + step + 1
        triples = render_triples(pretrain_edits(self.cfg.batch_size, seed), seed, self.size)
        targets = torch.from_numpy(np.stack([t for _, t in triples])).permute(0, 3, 1, 2)
        return targets.to(self.device).float() / 255.0, [p for p, _ in triples]

    def encode(self, prompts: list[str]) -> Conditioning:
        """The instructions' encodings with gradients, and each source's tokens (clean, in [-1, 1])."""
        cond = super().encode([str(p) for p in prompts])
        sources = torch.stack([conditions_of(p)[0].tensor() for p in prompts]).to(self.backbone.device)
        return Conditioning({**cond.tensors, "source": pack_pixels(sources * 2 - 1, self.backbone.patch)})

    def eval_reward(self) -> Any:
        """The evaluation's reward: the edit verifier (figures on test- and novel-split edits)."""
        from flowrl.rewards.built import BuiltReward
        from flowrl.world.edit_components import WorldEditVerifier

        return BuiltReward("world_edit", 1.0, WorldEditVerifier(WorldEditVerifier.Config()))

    def eval_prompts(self, split: EvalSplit, count: int) -> list[str]:
        from flowrl.world.edit_components import WorldEditPrompts

        return list(WorldEditPrompts(WorldEditPrompts.Config(eval_split=split, eval_count=count)).heldout())

    def eval_figures(self, figures: dict[str, float]) -> dict[str, float]:
        keys = ("score", "strict", "strict_se", "follow", "preserve", *(f"strict/{k}" for k in EDIT_KINDS))
        return {key: figures[key] for key in keys if key in figures}

    def describe(self, figures: dict[str, Any]) -> str:
        kinds = " ".join(f"{k} {figures.get(f'test/strict/{k}', float('nan')):.2f}" for k in EDIT_KINDS)
        return (
            f"eval step {figures['step']}: test score {figures['test/score']:.3f} strict {figures['test/strict']:.3f}"
            f" ({kinds}; follow {figures['test/follow']:.3f} preserve {figures['test/preserve']:.3f}) | "
            f"novel score {figures['novel/score']:.3f} strict {figures['novel/strict']:.3f}"
        )
