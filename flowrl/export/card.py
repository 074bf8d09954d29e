"""The model card of an exported checkpoint: a README.md with the YAML front matter model hubs read (licence,
base model, library, pipeline tag, tags) and a body a colleague reads (the method as parts, the held-out
figures with their intervals, the sample grid and its prompts, how to load the weights, the licence).

Every figure comes from the run folder (``metrics.jsonl``, ``RUN/suites``); nothing is typed in.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

import attrs

Z95 = 1.959964  # the normal 95% quantile: evaluations average hundreds of held-out prompts


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
    rewards: tuple[tuple[str, float], ...]  # (reward, weight)
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


def _cell(value: tuple[float, float] | None) -> str:
    if value is None:
        return "not evaluated"
    mean, se = value
    if not math.isfinite(se):
        return f"{mean:.3f}"
    return f"{mean:.3f} ± {se:.3f} [{mean - Z95 * se:.3f}, {mean + Z95 * se:.3f}]"


def _figure_rows(figures: Sequence[Figure], step: int) -> list[str]:
    rows = [f"| figure | initial policy (step 0) | this checkpoint (step {step}) | change |",
            "| --- | ---: | ---: | ---: |"]
    for f in figures:
        change = f"{f.final[0] - f.initial[0]:+.3f}" if f.initial and f.final else ""
        rows.append(f"| `{f.name}` | {_cell(f.initial)} | {_cell(f.final)} | {change} |")
    return rows


def _front_matter(facts: CardFacts) -> list[str]:
    tags = ["flowrl", "reinforcement-learning", facts.name, *(["lora"] if facts.lora else [])]
    matter = {
        "license": facts.licence,
        **({"base_model": facts.base} if facts.base_is_hub_id else {}),
        "library_name": "diffusers",
        "pipeline_tag": "text-to-video" if facts.video else "text-to-image",
        "tags": tags,
    }
    # JSON values are valid YAML scalars and lists, so every value is quoted as the hubs' parsers expect
    return ["---", *(f"{key}: {json.dumps(value)}" for key, value in matter.items()), "---", ""]


def _usage(facts: CardFacts) -> list[str]:
    base = facts.base if facts.base_is_hub_id else "BASE_FOLDER_OR_HUB_ID"
    lines = ["## Use", "", "```python", f"from diffusers import {facts.pipeline_class}"]
    if facts.lora:
        lines += [f'pipe = {facts.pipeline_class}.from_pretrained("{base}")',
                  'pipe.load_lora_weights("THIS_FOLDER/lora")']
    else:
        lines[-1] = f"from diffusers import {facts.pipeline_class}, {facts.transformer_class}"
        lines += [f'transformer = {facts.transformer_class}.from_pretrained("THIS_FOLDER", subfolder="transformer")',
                  f'pipe = {facts.pipeline_class}.from_pretrained("{base}", transformer=transformer)']
    lines += ["```", ""]
    if facts.lora:
        lines += ["`lora_kohya.safetensors` holds the same LoRA in the kohya naming (ComfyUI's `models/loras`)."]
        if facts.full_weights:
            lines += ["`transformer/` holds the base's transformer with this LoRA merged in "
                      f"(`{facts.transformer_class}.from_pretrained(THIS_FOLDER, subfolder=\"transformer\")`)."]
        lines.append("")
    lines += ["`recipe.toml` is the resolved recipe the run trained with; `flowrl train recipe.toml` trains it "
              "again (the same seed gives the same run on the same machine).", ""]
    return lines


def model_card(facts: CardFacts) -> str:
    """The README.md text of an exported folder."""
    parts = ", ".join(f"{kind} `{name}`" for kind, name in facts.parts.items())
    rewards = ", ".join(f"`{name}` (weight {weight:g})" for name, weight in facts.rewards)
    what = "LoRA adapter" if facts.lora else "fine-tuned transformer"
    lines = [
        *_front_matter(facts),
        f"# {facts.name}",
        "",
        f"A {what} for `{facts.base}`, trained by reinforcement learning with flowrl (`pip install flowrl-grpo`) "
        f"from the recipe `{facts.name}`: {parts}; reward {rewards}. These are the weights of "
        f"iteration {facts.step} (the run logged {facts.iterations} iterations, {facts.nfe:,} rollout NFE).",
        "",
        "## Held-out figures",
        "",
    ]
    if facts.figures:
        lines += [*_figure_rows(facts.figures, facts.step), "",
                  f"Mean ± standard error over the recipe's held-out prompts [95% interval, normal approximation], "
                  f"from deterministic ODE samples with {facts.eval_steps} steps, as `flowrl eval` computes them.", ""]
        bare = [f"`{f.name}`" for f in facts.figures
                if any(v is not None and not math.isfinite(v[1]) for v in (f.initial, f.final))]
        if bare:
            lines += [f"{', '.join(bare)}: a mean alone; the reward reports no per-prompt spread (no `_se` figure),"
                      " so no interval. `flowrl suite run` gives intervals for any reward.", ""]
    else:
        lines += ["The run logged no held-out evaluation (trainer.eval_every and eval_every_nfe were 0).", ""]
    if facts.suites:
        lines += ["## Evaluation suites", "", "As `flowrl suite compare` wrote them for this run:", ""]
        for table in facts.suites:
            lines += [table.strip(), ""]
    if facts.sample_file:
        lines += ["## Samples", "", f"![samples]({facts.sample_file})", "",
                  "One row per prompt, top to bottom (deterministic ODE samples, seed 0):", ""]
        lines += [f"{i}. {prompt}" for i, prompt in enumerate(facts.sample_prompts, 1)]
        lines.append("")
    lines += _usage(facts)
    lines += ["## Licence", "", facts.licence_note, ""]
    return "\n".join(lines)
