"""The embedded world as flowrl parts: its prompt source, its verifier reward and its pre-trained backbone."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import attrs
import numpy as np
import torch
from attrs.validators import gt, in_
from torch import Tensor

from flowrl.backbones.common.settings import DType
from flowrl.backbones.flux.adapter import FluxFromPretrained
from flowrl.core.choices import one_of
from flowrl.core.interfaces import PromptSource, RewardModel
from flowrl.core.registry import register
from flowrl.world.grammar import KINDS, EvalSplit, Scene, balanced_scenes, enumerate_scenes, parse
from flowrl.world.verify import score_batch, verify_batch

BASE_MODEL = Path(__file__).with_name("base_model")


@register("prompts", "world")
class WorldPrompts(PromptSource):
    """The embedded world's prompts: RL trains on the ``train`` split; evaluation uses a fixed,
    category-balanced set from ``eval_split`` (``test``: other scenes of the same vocabulary and pairs;
    ``novel``: compositions with held-out colour-shape pairs; ``train``)."""

    @attrs.frozen
    class Config:
        eval_split: EvalSplit = attrs.field(default="test", validator=one_of(EvalSplit))
        eval_count: int = attrs.field(default=256, validator=gt(0))  # evaluation prompts, equal per kind
        eval_seed: int = 1234  # fixes which evaluation prompts
        kinds: tuple[str, ...] = attrs.field(default=KINDS, validator=attrs.validators.deep_iterable(in_(KINDS)))

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.train = [s.text for s in enumerate_scenes("train") if s.kind in config.kinds]
        scenes = balanced_scenes(config.eval_split, config.eval_count, config.eval_seed, config.kinds)
        self._heldout = [s.text for s in scenes]

    @classmethod
    def gives_conditions(cls, config: Config) -> Literal["none"]:
        return "none"

    def sample(self, n: int, generator: torch.Generator) -> list[str]:
        index = torch.randint(len(self.train), (n,), generator=generator)
        return [self.train[int(i)] for i in index]

    def heldout(self) -> list[str]:
        return list(self._heldout)


@lru_cache(maxsize=4096)
def _scene(text: str) -> Scene:
    return parse(text)


def _mean_se(values: np.ndarray) -> tuple[float, float]:
    """Mean and its standard error (sample std / sqrt(n); 0 for fewer than two values)."""
    n = len(values)
    se = float(values.std(ddof=1) / np.sqrt(n)) if n > 1 else 0.0
    return float(values.mean()), se


@register("reward", "world_verifier")
class WorldVerifier(RewardModel):
    """The embedded world's verifier: the share of a prompt's constraints an image meets, less one per extra
    object (or strict 0/1: all met, nothing extra)."""

    @attrs.frozen
    class Config:
        strict: bool = False  # 1 only when every constraint is met and nothing is extra

    def score(self, images: Tensor, prompts: list[str]) -> Tensor:
        scores, strict = score_batch(images.detach().float().cpu(), [_scene(p) for p in prompts])
        return torch.from_numpy(strict if self.config.strict else scores).float()

    def eval_metrics(self, images: Tensor, prompts: list[str]) -> dict[str, float]:
        """``score``, ``strict`` and their standard errors; ``strict/KIND`` (and its standard error) per prompt kind;
        ``objects`` (detected per image) against ``objects_asked``."""
        scenes = [_scene(p) for p in prompts]
        verdicts = verify_batch(images.detach().float().cpu(), scenes)
        score = np.asarray([v.score for v in verdicts], dtype=np.float64)
        strict = np.asarray([v.strict for v in verdicts], dtype=np.float64)
        out: dict[str, float] = {}
        out["score"], out["score_se"] = _mean_se(score)
        out["strict"], out["strict_se"] = _mean_se(strict)
        kinds = np.asarray([s.kind for s in scenes])
        for kind in KINDS:
            if (kinds == kind).any():
                out[f"strict/{kind}"], out[f"strict/{kind}_se"] = _mean_se(strict[kinds == kind])
        out["objects"] = float(np.mean([len(v.detections) for v in verdicts]))
        out["objects_asked"] = float(np.mean([s.num_objects for s in scenes]))
        return out


@register("backbone", "world_tiny")
class WorldTiny(FluxFromPretrained):
    """The embedded world's pre-trained tiny FLUX (pixel space, 32 px), shipped with flowrl."""

    @attrs.frozen
    class Config:
        path: str = ""  # empty: the shipped base model (stage 2); flowrl/world/base_model_clean: stage 1
        resolution: int = attrs.field(default=32, validator=gt(0))
        guidance: float = 3.5
        max_sequence_length: int = attrs.field(default=16, validator=gt(0))
        dtype: DType = attrs.field(default="float32", validator=one_of(DType))

    @staticmethod
    def transformer_on_meta(config: Any) -> Any:
        """The shipped (or given) model's transformer without weights (flowrl.backbones.lora.targets)."""
        from flowrl.backbones.lora.targets import saved_transformer

        return saved_transformer(config.path or str(BASE_MODEL))

    def load_pipeline(self) -> Any:
        if not self.config.path:
            if not (BASE_MODEL / "model_index.json").exists():
                raise FileNotFoundError(
                    f"the shipped base model is missing at {BASE_MODEL}; regenerate it with "
                    "`flowrl pretrain recipes/pretrain/world.toml` (stage 2, from base_model_clean; docs/world.md)"
                )
            self.config = attrs.evolve(self.config, path=str(BASE_MODEL))
        return super().load_pipeline()
