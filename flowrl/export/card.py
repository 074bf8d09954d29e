"""The model card of an exported checkpoint: a README.md with the YAML front matter model hubs read (licence,
base model, library, pipeline tag, tags) and a body a colleague reads (the method as parts, the held-out
figures with their intervals, the sample grid and its prompts, how to load the weights, the licence). For a base
that takes condition images (an edit base) it says so, from the base's ``accepts()``: the pipeline tag is
``image-to-image``, the intro names what each prompt brings, the grid's rows start with their source image.

Every figure comes from the run folder (``metrics.jsonl``, ``RUN/suites``); nothing is typed in. The code under
"Use" runs as written in the exported folder (:mod:`~flowrl.export.usage`); pasted markdown (the suites' tables)
has its headings moved under the card's own (:func:`demote_headings`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence

from flowrl.config.reward_weights import describe_weight
from flowrl.export.facts import CardFacts, Figure

__all__ = ["CardFacts", "Figure", "model_card", "demote_headings"]

Z95 = 1.959964  # the normal 95% quantile: evaluations average hundreds of held-out prompts


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


def _pipeline_tag(facts: CardFacts) -> str:
    """The hubs' task: a base that takes condition images makes images (an edit) or clips from an image."""
    if facts.conditioned:
        return "image-to-video" if facts.video else "image-to-image"
    return "text-to-video" if facts.video else "text-to-image"


def conditions_note(facts: CardFacts) -> list[str]:
    """For a base that takes condition images (an edit base): what it is and what each prompt must bring, from
    the base's ``accepts()`` (its ConditionSpec); nothing for a text-to-image base."""
    if not facts.conditioned:
        return []
    takes = facts.takes
    what = "an image-to-video model" if facts.video else "an image-editing model"
    text = "a text" if facts.video else "an instruction"
    result = "the clip" if facts.video else "the edited image"
    modes = " or ".join(takes.modes) if takes.modes else "any mode"
    optional = "" if takes.count[0] else " (optional: a prompt without one is generated from the text alone)"
    return [f"**This is {what}.** Each prompt is {text} with {takes.described}, {modes}{optional}, and the model "
            f"generates {result} from both, as the base `{facts.base}` declares; pass the image with the prompt "
            "(`--image` below).", ""]


def _front_matter(facts: CardFacts) -> list[str]:
    tags = ["flowrl", "reinforcement-learning", facts.name, *(["lora"] if facts.lora else []),
            *(["image-editing"] if facts.conditioned and not facts.video else [])]
    matter = {
        "license": facts.licence,
        **({"base_model": facts.base} if facts.base_is_hub_id else {}),
        "library_name": "diffusers",
        "pipeline_tag": _pipeline_tag(facts),
        "tags": tags,
    }
    # JSON values are valid YAML scalars and lists, so every value is quoted as the hubs' parsers expect
    return ["---", *(f"{key}: {json.dumps(value)}" for key, value in matter.items()), "---", ""]


def demote_headings(markdown: str, top: int) -> str:
    """``markdown`` with its headings moved down so that its highest becomes level ``top`` (at most 6), their
    relative levels kept; lines inside fenced code blocks are left alone."""
    heading = re.compile(r"^(#{1,6})(\s)")
    lines = markdown.splitlines()
    fenced, levels = False, []
    for line in lines:
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and (found := heading.match(line)):
            levels.append(len(found.group(1)))
    if not levels or min(levels) >= top:
        return markdown
    shift, fenced, out = top - min(levels), False, []
    for line in lines:
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and (found := heading.match(line)):
            line = "#" * min(6, len(found.group(1)) + shift) + line[len(found.group(1)):]
        out.append(line)
    return "\n".join(out)


def _intro(facts: CardFacts, parts: str, rewards: str) -> str:
    method = f"from the recipe `{facts.name}`: {parts}; reward {rewards}"
    logged = f"the run logged {facts.iterations} iterations, {facts.nfe:,} rollout NFE"
    if facts.initial:
        which = f"`{facts.checkpoint}`" if facts.checkpoint else "the checkpoint asked for"
        return (f"**These are the initial weights of the base `{facts.base}`, not fine-tuned ones.** The run trained"
                f" with flowrl (`pip install flowrl-grpo`) {method}, but {which} is its step 0: no later evaluation"
                f" improved on the initial policy ({logged}), so this folder holds the base's weights"
                + (" with the LoRA at its initialisation (no change)" if facts.lora else "") + ".")
    what = "LoRA adapter" if facts.lora else "fine-tuned transformer"
    return (f"A {what} for `{facts.base}`, trained by reinforcement learning with flowrl (`pip install flowrl-grpo`)"
            f" {method}. These are the weights of iteration {facts.step} ({logged}).")


def model_card(facts: CardFacts) -> str:
    """The README.md text of an exported folder."""
    from flowrl.export.usage import usage

    parts = ", ".join(f"{kind} `{name}`" for kind, name in facts.parts.items())
    rewards = ", ".join(f"`{name}` (weight {describe_weight(weight)})" for name, weight in facts.rewards)
    lines = [
        *_front_matter(facts),
        f"# {facts.name}" + (" (initial weights)" if facts.initial else ""),
        "",
        _intro(facts, parts, rewards),
        "",
        *conditions_note(facts),
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
        for table in facts.suites:  # their own headings go under this section's (H1 -> H3, H2 -> H4)
            lines += [demote_headings(table.strip(), 3), ""]
    if facts.sample_file:
        lines += ["## Samples", "", f"![samples]({facts.sample_file})", ""]
        if any(facts.sample_sources):
            meaning = facts.takes.meaning[0] if facts.takes.meaning else "the condition image"
            lines += [f"One row per prompt, top to bottom: {meaning} first (its file in `sources/`), then the results "
                      "(deterministic ODE samples, seed 0):", ""]
            lines += [f"{i}. {prompt}" + (f" (`{'`, `'.join(files)}`)" if files else "")
                      for i, (prompt, files) in enumerate(zip(facts.sample_prompts, facts.sample_sources,
                                                              strict=True), 1)]
        else:
            lines += ["One row per prompt, top to bottom (deterministic ODE samples, seed 0):", ""]
            lines += [f"{i}. {prompt}" for i, prompt in enumerate(facts.sample_prompts, 1)]
        lines.append("")
    lines += usage(facts)
    lines += ["## Licence", "", facts.licence_note, ""]
    return "\n".join(lines)
