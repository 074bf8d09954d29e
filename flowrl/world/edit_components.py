"""The world's edit task as flowrl parts: its prompt source (instructions with rendered source images) and its
verifier reward (reads each prompt's source image)."""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

import attrs
import numpy as np
import torch
from attrs.validators import deep_iterable, gt, in_
from torch import Tensor

from flowrl.core.choices import one_of
from flowrl.core.conditions import Condition, Prompt, conditions_of
from flowrl.core.interfaces import PromptSource, RewardModel
from flowrl.core.registry import register
from flowrl.world.components import _mean_se
from flowrl.world.edit import EDIT_KINDS, Edit, balanced_edits, enumerate_edits, parse_instruction
from flowrl.world.edit_render import render_edit
from flowrl.world.edit_verify import verify_edit_batch
from flowrl.world.grammar import EvalSplit

LAYOUT_SEED = 20261216  # fixes each training edit's source drawings


@register("prompts", "world_edit")
class WorldEditPrompts(PromptSource):
    """The world's edit task: each prompt is an instruction with its rendered source image. RL trains on the
    ``train`` edits, the kind drawn uniformly, then an edit of that kind, then one of its ``layouts`` fixed source
    drawings (the kinds are as frequent as in evaluation; drawn uniformly over all edits, count changes would be
    1% of the draws and recolours 43%); evaluation uses a fixed set from ``eval_split`` whose kinds take turns,
    each source drawn once (docs/editing.md)."""

    @attrs.frozen
    class Config:
        eval_split: EvalSplit = attrs.field(default="test", validator=one_of(EvalSplit))
        eval_count: int = attrs.field(default=1000, validator=gt(0))  # evaluation prompts, equal per kind
        eval_seed: int = 1234  # fixes which evaluation edits and their sources
        kinds: tuple[str, ...] = attrs.field(default=EDIT_KINDS, validator=deep_iterable(in_(EDIT_KINDS)))
        layouts: int = attrs.field(default=4, validator=gt(0))  # source drawings per training edit

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.train = enumerate_edits("train", config.kinds)
        kinds = list(dict.fromkeys(config.kinds))
        self._by_kind = [[i for i, e in enumerate(self.train) if e.kind == k] for k in kinds]
        edits = balanced_edits(config.eval_split, config.eval_count, config.eval_seed, config.kinds)
        rng = [np.random.default_rng((config.eval_seed, i)) for i in range(len(edits))]
        self._heldout = [_prompt(e, render_edit(e, r)[0]) for e, r in zip(edits, rng, strict=True)]
        self._drawn: dict[int, str] = {}

    @classmethod
    def gives_conditions(cls, config: Config) -> Literal["all"]:
        return "all"

    def sample(self, n: int, generator: torch.Generator) -> list[str]:
        kinds = torch.randint(len(self._by_kind), (n,), generator=generator).tolist()
        picks = torch.rand(n, generator=generator, dtype=torch.float64).tolist()
        layouts = torch.randint(self.config.layouts, (n,), generator=generator).tolist()
        out = []
        for kind, pick, layout in zip(kinds, picks, layouts, strict=True):
            pool = self._by_kind[kind]
            out.append(self._training(pool[min(int(pick * len(pool)), len(pool) - 1)] * self.config.layouts + layout))
        return out

    def _training(self, i: int) -> str:
        if i not in self._drawn:
            edit = self.train[i // self.config.layouts]
            self._drawn[i] = _prompt(edit, render_edit(edit, np.random.default_rng((LAYOUT_SEED, i)))[0])
        return self._drawn[i]

    def heldout(self) -> list[str]:
        return list(self._heldout)


def _prompt(edit: Edit, source: np.ndarray) -> str:
    return Prompt(edit.text, [Condition(source)])


@lru_cache(maxsize=4096)
def _kind(text: str) -> str:
    return parse_instruction(text).kind


@register("reward", "world_edit_verifier")
class WorldEditVerifier(RewardModel):
    """The world's edit verifier: follow x preserve of an edit against its prompt's source image (or strict 0/1:
    the instruction followed, the rest kept, nothing extra)."""

    @attrs.frozen
    class Config:
        strict: bool = False  # 1 only when every constraint is met and nothing is extra

    @classmethod
    def needs_conditions(cls, config: Config) -> bool:
        return True  # the source image: what the result must follow from and preserve

    def _verdicts(self, images: Tensor, prompts: list[str]) -> list:
        sources = []
        for p in prompts:
            conditions = conditions_of(p)
            if len(conditions) != 1:
                raise ValueError(
                    f"world_edit_verifier scores an edit against its source image; {str(p)[:40]!r} has "
                    f'{len(conditions)} condition images (use [prompts] type = "world_edit")'
                )
            sources.append(conditions[0].pixels)
        return verify_edit_batch(images.detach().float().cpu(), np.stack(sources), [str(p) for p in prompts])

    def score(self, images: Tensor, prompts: list[str]) -> Tensor:
        verdicts = self._verdicts(images, prompts)
        values = [v.strict if self.config.strict else v.score for v in verdicts]
        return torch.tensor(values, dtype=torch.float32)

    def eval_metrics(self, images: Tensor, prompts: list[str]) -> dict[str, float]:
        """``score``, ``strict`` and their standard errors; ``strict/KIND`` per edit kind present; ``follow`` and
        ``preserve`` (the mean shares of each side's credit)."""
        verdicts = self._verdicts(images, prompts)
        score = np.asarray([v.score for v in verdicts], dtype=np.float64)
        strict = np.asarray([v.strict for v in verdicts], dtype=np.float64)
        out: dict[str, float] = {}
        out["score"], out["score_se"] = _mean_se(score)
        out["strict"], out["strict_se"] = _mean_se(strict)
        kinds = np.asarray([_kind(str(p)) for p in prompts])
        for kind in EDIT_KINDS:
            if (kinds == kind).any():
                out[f"strict/{kind}"] = float(strict[kinds == kind].mean())
        out["follow"] = float(np.mean([v.follow_score for v in verdicts]))
        out["preserve"] = float(np.mean([v.preserve_score for v in verdicts]))
        return out
