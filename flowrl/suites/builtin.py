"""Built-in suites: the embedded world's test split, the preference benchmarks (the HPSv2 benchmark, DrawBench,
PartiPrompts) scored by flowrl's preference rewards, and OCR accuracy."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import attrs
from attrs.validators import gt
from torch import Tensor

from flowrl.core.errors import UserError
from flowrl.core.registry import build, register
from flowrl.suites.interface import Item, Suite, plain
from flowrl.suites.prompt_sets import suite_items
from flowrl.suites.protocol import Protocol


@register("suite", "world")
class WorldSuite(Suite):
    """The embedded world's test split (256 prompts, 64 per kind) scored by its verifier: flowrl eval's figures."""

    primary = "strict"
    fractions = ("strict", "score")
    lossless = True  # the verifier reads float images, as flowrl eval scores them
    source = "flowrl's embedded world (docs/world.md): the held-out split of the world prompt source"

    @attrs.frozen
    class Config:
        split: str = attrs.field(default="test", validator=attrs.validators.in_(("test", "novel", "train")))
        count: int = attrs.field(default=256, validator=gt(0))

    def protocol(self) -> Protocol:
        # flowrl eval's: 16 ODE steps at shift 3, the base's 32 px and guidance, one stream of noise from seed 0
        return Protocol(steps=16, images=1, seed=0, shift=3.0, noise="stream")

    def items(self) -> list[Item]:
        from flowrl.world.components import WorldPrompts
        from flowrl.world.grammar import parse

        source = WorldPrompts(WorldPrompts.Config(eval_split=self.config.split, eval_count=self.config.count))
        return [Item(text, parse(text).kind) for text in source.heldout()]

    def score(self, images: Tensor, items: Sequence[Item]) -> list[dict[str, float]]:
        from flowrl.world.grammar import parse
        from flowrl.world.verify import verify_batch

        verdicts = verify_batch(images.detach().float().cpu(), [parse(item.prompt) for item in items])
        return [{"strict": float(v.strict), "score": float(v.score)} for v in verdicts]


class RewardSuite(Suite):
    """A prompt set scored by reward models (``scorers``: ``[[reward]]``-style tables, each a figure named by its
    ``name`` or its type); the table reports each scorer's mean per category and overall."""

    prompt_set: ClassVar[str] = ""  # the fetched set's name (flowrl data fetch)
    scoring = ("scorers",)
    default_scorers: ClassVar[tuple[dict[str, Any], ...]] = ()

    @attrs.frozen
    class Config:
        prompts: str = ""  # a prompt file of your own (default: the fetched set)
        scorers: tuple[dict[str, Any], ...] = ()  # reward tables; default: the suite's own

    def protocol(self) -> Protocol:
        # flowrl's choice for the preference benchmarks: FLUX.1-dev's default 28 steps, the base's resolution and
        # guidance, one image a prompt (the papers' HPD tables state their own)
        return Protocol(steps=28, images=1, seed=0)

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self._models: list[tuple[str, Any]] | None = None
        first = (config.scorers or self.default_scorers or ({"type": "score"},))[0]
        self.primary = str(first.get("name", first.get("type", "score")))  # the first scorer's figure

    def items(self) -> list[Item]:
        return suite_items(self.config.prompts, self.prompt_set)

    def scorer_problems(self, scoring: dict[str, Any]) -> list[str]:
        given = scoring.get("scorers") or ()
        if not given or plain(given) == plain(self.default_scorers):
            return []
        names = ", ".join(str(s.get("name", s.get("type", "?"))) for s in given if isinstance(s, dict))
        own = ", ".join(str(s.get("name", s.get("type"))) for s in self.default_scorers) or "none"
        return [f"scored by {names}, not the suite's own scorers ({own})"]

    def models(self) -> list[tuple[str, Any]]:
        if self._models is None:
            specs = self.config.scorers or self.default_scorers
            if not specs:
                raise UserError(f"suite '{self.registered_name}' has no scorers; give [[scorer]] tables")
            models = []
            for spec in specs:
                spec = dict(spec)
                name = str(spec.pop("name", spec.get("type", "")))
                models.append((name, build("reward", spec)))
            self._models = models
        return self._models

    def check(self) -> None:
        """Every scorer's extras, weights or server, all missing ones named in one message."""
        problems = []
        try:
            models = self.models()
        except UserError as error:
            raise UserError(f"suite '{self.registered_name}': {error}") from None
        for name, model in models:
            try:
                model.check()
            except UserError as error:
                problems.append(f"{name}: {error}")
        if problems:
            raise UserError(f"suite '{self.registered_name}' cannot score: " + "; ".join(problems))

    def score(self, images: Tensor, items: Sequence[Item]) -> list[dict[str, float]]:
        from flowrl.rewards.frames import score_pictures

        prompts = [item.prompt for item in items]
        columns = {}
        for name, model in self.models():
            scores = score_pictures(model, images, prompts)
            if not isinstance(scores, Tensor) or scores.shape != (len(items),):
                raise UserError(f"scorer '{name}' returned {type(scores).__name__}, not one score per image")
            columns[name] = scores.detach().double().cpu().numpy()
        return [{name: float(values[i]) for name, values in columns.items()} for i in range(len(items))]


PREFERENCE = ({"type": "hpsv2", "name": "hps_v2.1"}, {"type": "pickscore"}, {"type": "imagereward"},
              {"type": "clipscore"}, {"type": "aesthetic"})


@register("suite", "hpsv2")
class HPSv2Suite(RewardSuite):
    """The HPSv2 benchmark: HPD v2's test prompts in four styles, HPS v2.1 per style and overall (plus PickScore,
    ImageReward, CLIPScore, aesthetic)."""

    prompt_set = "hpsv2"
    default_scorers = PREFERENCE
    source = "HPSv2 benchmark prompts (zhwang/HPDv2 benchmark/{anime,concept-art,paintings,photo}.json)"


@register("suite", "drawbench")
class DrawBenchSuite(RewardSuite):
    """DrawBench's 200 prompts in 11 categories, scored by the preference rewards."""

    prompt_set = "drawbench"
    default_scorers = PREFERENCE
    source = "DrawBench (Imagen): the prompts of its published sheet, columns Prompts and Category"


@register("suite", "partiprompts")
class PartiPromptsSuite(RewardSuite):
    """PartiPrompts: 1,632 prompts in 12 categories, scored by the preference rewards."""

    prompt_set = "partiprompts"
    default_scorers = PREFERENCE
    source = "google-research/parti PartiPrompts.tsv"


OCR = ({"type": "ocr", "name": "ocr"},)


@register("suite", "ocr")
class OCRSuite(RewardSuite):
    """OCR accuracy on text-rendering prompts: 1 - normalised edit distance of the quoted text (RapidOCR)."""

    prompt_set = "ocr"
    default_scorers = OCR
    fractions = ("ocr",)
    source = "a file of prompts with the text to render in quotes (Flow-GRPO's OCR test prompts, one a line)"
    def protocol(self) -> Protocol:
        # Flow-GRPO's OCR evaluation setting for SD3.5-M: 512 px, 40 steps, guidance 4.5
        return Protocol(steps=40, images=1, seed=0, guidance=4.5, resolution=512)

