"""What an exported checkpoint's model card says, gathered from the run folder and the loaded checkpoint: the facts
:mod:`~flowrl.export.card` writes the card from and :mod:`~flowrl.export.usage` writes its loading code from."""

from __future__ import annotations

from typing import Any

import attrs

from flowrl.config.reward_weights import Weight


@attrs.frozen
class Takes:
    """What the base takes besides the text, for the card (``count == (0, 0)``: a text-to-image base)."""

    count: tuple[int, int] = (0, 0)  # at least, at most
    modes: tuple[str, ...] = ()
    meaning: tuple[str, ...] = ()  # one phrase per position ("the source image")
    described: str = ""  # ConditionSpec.describe(): "exactly 1 image (the source image)"


@attrs.frozen
class Figure:
    """One held-out figure at the initial policy and at the exported checkpoint (None where not evaluated)."""

    name: str  # the metrics key, e.g. eval/strict
    initial: tuple[float, float] | None  # (mean, standard error) at step 0
    final: tuple[float, float] | None  # (mean, standard error) at the checkpoint's step


@attrs.frozen
class CardFacts:
    """What the card says, gathered from the run folder and the loaded checkpoint."""

    name: str  # the recipe's name
    base: str  # the base model: a hub id, a folder, or a built-in backbone's name
    base_is_hub_id: bool  # whether ``base`` names a hub repository (then it goes into ``base_model``)
    licence: str  # an SPDX id or a hub licence name; "other" when unknown
    licence_note: str  # one sentence on where the licence comes from
    parts: dict[str, str]  # kind -> registered part (selector, sampler, kernel, advantage, loss)
    rewards: tuple[tuple[str, Weight], ...]  # (reward, weight: a number or a schedule)
    step: int  # the checkpoint's iteration
    iterations: int  # the run's last logged iteration
    nfe: int  # rollout NFE up to the last logged iteration
    eval_steps: int  # ODE steps of the evaluation samples
    figures: tuple[Figure, ...]
    lora: bool  # the weights are a LoRA (else the trained transformer)
    full_weights: bool  # the folder also holds the (merged) transformer
    pipeline_class: str  # the diffusers pipeline class of the base
    transformer_class: str  # the diffusers class of its transformer
    video: bool
    sample_prompts: tuple[str, ...]  # one row of the grid per prompt, top to bottom
    sample_file: str  # the grid's file name in the folder ("" when no samples were drawn)
    suites: tuple[str, ...] = ()  # markdown tables of RUN/suites comparisons, as flowrl suite compare wrote them
    checkpoint: str = ""  # the checkpoint's folder name in the run (best, step_000123)
    loader: str = "diffusers"  # "diffusers": a diffusers pipeline loads the folder; "flowrl": only flowrl does
    base_ref: str = ""  # what the diffusers code loads the base from: a hub id, or the shipped "base" folder
    not_diffusers: str = ""  # loader "flowrl": why a diffusers pipeline cannot load these weights (a sentence)
    torch_dtype: str = ""  # the base's dtype for the diffusers code (float32, bfloat16, float16), "" for none
    call: tuple[tuple[str, Any], ...] = ()  # keyword arguments of the pipeline call: flowrl's evaluation settings
    example_prompt: str = "a photo"  # the prompt of the code's example
    takes: Takes = Takes()  # the condition images the base takes with the text (none: a text-to-image base)
    sample_sources: tuple[tuple[str, ...], ...] = ()  # each grid row's condition images in the folder (sources/)
    example_images: tuple[str, ...] = ()  # the example prompt's condition images in the folder (its --image)

    @property
    def conditioned(self) -> bool:
        """The base takes condition images (an edit base: a source image with each instruction)."""
        return self.takes.count[1] > 0

    @property
    def initial(self) -> bool:
        """The weights are the run's initial ones (step 0): no training, or none that beat them."""
        return self.step == 0
