"""The embedded world as flowrl parts: its prompt source, its verifier reward and its pre-trained backbone."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import attrs
import torch
from attrs.validators import gt, in_
from torch import Tensor

from flowrl.backbones.flux import DTYPES, FluxFromPretrained
from flowrl.interfaces import PromptSource, RewardModel
from flowrl.registry import register
from flowrl.world.grammar import KINDS, Scene, enumerate_scenes, parse, sample_scenes
from flowrl.world.verify import score_batch

BASE_MODEL = Path(__file__).with_name("base_model")


@register("prompts", "world")
class WorldPrompts(PromptSource):
    """The embedded world's prompts: training compositions, and held-out ones never seen in pre-training."""

    @attrs.frozen
    class Config:
        heldout_count: int = attrs.field(default=64, validator=gt(0))  # held-out prompts used by eval
        heldout_seed: int = 1234  # fixes which held-out prompts
        kinds: tuple[str, ...] = attrs.field(default=KINDS, validator=attrs.validators.deep_iterable(in_(KINDS)))

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.train = [s.text for s in enumerate_scenes("train") if s.kind in config.kinds]
        heldout = sample_scenes("heldout", config.heldout_count, config.heldout_seed, config.kinds)
        self._heldout = [s.text for s in heldout]

    def sample(self, n: int, generator: torch.Generator) -> list[str]:
        index = torch.randint(len(self.train), (n,), generator=generator)
        return [self.train[int(i)] for i in index]

    def heldout(self) -> list[str]:
        return list(self._heldout)


@lru_cache(maxsize=4096)
def _scene(text: str) -> Scene:
    return parse(text)


@register("reward", "world_verifier")
class WorldVerifier(RewardModel):
    """The embedded world's verifier: the fraction of a prompt's constraints an image meets (or strict 0/1)."""

    @attrs.frozen
    class Config:
        strict: bool = False  # 1 only when every constraint is met

    def score(self, images: Tensor, prompts: list[str]) -> Tensor:
        scores, strict = score_batch(images.detach().float().cpu(), [_scene(p) for p in prompts])
        return torch.from_numpy(strict if self.config.strict else scores).float()

    def eval_metrics(self, images: Tensor, prompts: list[str]) -> dict[str, float]:
        scores, strict = score_batch(images.detach().float().cpu(), [_scene(p) for p in prompts])
        return {"score": float(scores.mean()), "strict": float(strict.mean())}


@register("backbone", "world_tiny")
class WorldTiny(FluxFromPretrained):
    """The embedded world's pre-trained tiny FLUX (pixel space, 32 px), shipped with flowrl."""

    @attrs.frozen
    class Config:
        path: str = ""  # empty: the shipped base model (stage 2); flowrl/world/base_model_clean: stage 1
        resolution: int = attrs.field(default=32, validator=gt(0))
        guidance: float = 3.5
        max_sequence_length: int = attrs.field(default=16, validator=gt(0))
        dtype: Literal["float32", "bfloat16", "float16"] = attrs.field(default="float32", validator=in_(tuple(DTYPES)))

    def load_pipeline(self) -> Any:
        if not self.config.path:
            if not (BASE_MODEL / "model_index.json").exists():
                raise FileNotFoundError(
                    f"the shipped base model is missing at {BASE_MODEL}; regenerate it with "
                    "`flowrl pretrain recipes/pretrain/world.toml` (stage 2, from base_model_clean; docs/world.md)"
                )
            self.config = attrs.evolve(self.config, path=str(BASE_MODEL))
        return super().load_pipeline()
