"""The "Use" section of an exported folder's model card: code that runs as written in that folder.

Two ways in. Where a diffusers pipeline can load the weights (a latent-space base named by a hub id, or a local
base shipped in the folder as ``base/``), a Python block loads the pipeline, puts the LoRA or the trained
transformer in, and draws one sample with flowrl's evaluation settings (size, steps, guidance, sequence length).
Where it cannot (the embedded world's pixel-space model has no VAE for a pipeline to decode with; the ``tiny_*``
twins are built by flowrl's code, not loaded from anywhere), the card says so plainly. Either way it gives the
flowrl commands that take the folder as they take a checkpoint (``flowrl sample .``, ``flowrl eval .``). For an
edit base the example passes its source image: ``--image sources/1.png`` (a file the export writes), the
pipeline's ``image=``.
"""

from __future__ import annotations

import json
from typing import Any

from flowrl.export.facts import CardFacts


def _literal(value: Any) -> str:
    """A Python literal of a setting (strings JSON-quoted, which Python reads the same)."""
    return json.dumps(value) if isinstance(value, str) else repr(value)


def diffusers_code(facts: CardFacts) -> list[str]:
    """The Python block: load, put the weights in, draw one sample."""
    dtype = f", dtype=torch.{facts.torch_dtype}" if facts.torch_dtype else ""
    base = json.dumps(facts.base_ref)
    imports = facts.pipeline_class if facts.lora else f"{facts.pipeline_class}, {facts.transformer_class}"
    lines = ["```python", "import torch", f"from diffusers import {imports}"]
    if facts.video:
        lines.append("from diffusers.utils import export_to_gif")
    source = example_images(facts)
    if source:
        lines.append("from diffusers.utils import load_image")
    lines.append("")
    if facts.lora:
        lines += [f"pipe = {facts.pipeline_class}.from_pretrained({base}{dtype})",
                  'pipe.load_lora_weights("lora")  # this folder\'s LoRA (lora/pytorch_lora_weights.safetensors)']
    else:
        lines += [f'transformer = {facts.transformer_class}.from_pretrained("transformer"{dtype})  # the trained one',
                  f"pipe = {facts.pipeline_class}.from_pretrained({base}, transformer=transformer{dtype})"]
    lines.append('pipe.to("cuda" if torch.cuda.is_available() else "cpu")')
    settings = "".join(f", {key}={_literal(value)}" for key, value in facts.call)
    if source:  # the base's condition image (an edit's source) goes in as the pipeline's image
        lines.append(f"source = load_image({json.dumps(source[0])})")
        settings = f", image=source{settings}"
    prompt = json.dumps(facts.example_prompt)
    if facts.video:
        lines += [f'frames = pipe(prompt={prompt}{settings}, output_type="pil").frames[0]',
                  'export_to_gif(frames, "sample.gif")']
    else:
        lines += [f"image = pipe(prompt={prompt}{settings}).images[0]", 'image.save("sample.png")']
    return [*lines, "```"]


def example_images(facts: CardFacts) -> tuple[str, ...]:
    """The example's ``--image`` files: its condition images in this folder, ``SRC.png`` (yours) where none is."""
    if not facts.conditioned:
        return ()
    return facts.example_images or ("SRC.png",)


def flowrl_commands(facts: CardFacts) -> list[str]:
    """The shell block: flowrl's own commands on this folder (an edit base's sample passes its source image:
    ``flowrl sample`` takes one ``--image`` per ``--prompt``, in order)."""
    out = "sample.webp" if facts.video else "sample.png"
    images = "".join(f" --image {json.dumps(path) if ' ' in path else path}" for path in example_images(facts))
    return ["```bash", "pip install flowrl-grpo",
            f"flowrl sample . --prompt {json.dumps(facts.example_prompt)}{images} --out {out}",
            "flowrl eval . --json", "```"]


def image_note(facts: CardFacts) -> list[str]:
    """Under the commands, for an edit base: how the source image is passed."""
    if not facts.conditioned:
        return []
    meaning = facts.takes.meaning[0] if facts.takes.meaning else "the condition image"
    given = facts.example_images or ("SRC.png",)
    where = ("its file from this folder's `sources/`" if facts.example_images
             else "`SRC.png` stands for your own image")
    lines = [f"`--image` passes a prompt's image, {meaning} ({where}): one `--image` per `--prompt`, in order (the"
             " i-th `--image` is the i-th prompt's); the grid's first column shows them."]
    if len(given) > 1 or facts.takes.count[1] > 1:
        lines[0] += (f" This base takes {facts.takes.described}; `flowrl sample` passes one a prompt, so give more"
                     " through a prompt file (`[prompts] type = \"jsonl\"`, `images = [...]`) and `flowrl eval`.")
    return [*lines, ""]


def usage(facts: CardFacts) -> list[str]:
    """The card's "Use" section."""
    lines = ["## Use", "", "The code below runs as written in a copy of this folder (from a hub repository:"
             " `hf download OWNER/NAME --local-dir DIR`, then in `DIR`).", ""]
    if facts.loader == "diffusers":
        where = (f"the base `{facts.base_ref}` comes from the Hugging Face hub" if facts.base_ref != "base"
                 else "the base pipeline is in `base/`")
        lines += [f"With diffusers, in this folder ({where}; the settings are those of flowrl's evaluation samples):",
                  "", *diffusers_code(facts), ""]
        if facts.lora:
            lines += ["`lora_kohya.safetensors` holds the same LoRA in the kohya naming (ComfyUI's `models/loras`)."]
            if facts.full_weights:
                lines += ["`transformer/` holds the base's transformer with this LoRA merged in: "
                          f'`{facts.transformer_class}.from_pretrained("transformer")`, passed as `transformer=` to'
                          " the pipeline in place of `load_lora_weights`."]
            lines.append("")
        lines += ["With flowrl, in this folder (the same samples and figures as the run's own checkpoint):", ""]
    else:
        lines += [f"**These weights load only through flowrl**, not with a plain diffusers pipeline: "
                  f"{facts.not_diffusers} With flowrl:", ""]
    lines += [*flowrl_commands(facts), "", *image_note(facts)]
    if facts.lora and facts.loader != "diffusers":
        lines += ["`lora/` and `lora_kohya.safetensors` hold the LoRA in the diffusers and kohya namings, for tools"
                  " that have this base.", ""]
    lines += ["`recipe.toml` is the resolved recipe the run trained with; `flowrl train recipe.toml` in this folder"
              " trains it again (the same seed gives the same run on the same machine). `flowrl_export.json` tells"
              " flowrl what the folder holds.", ""]
    return lines
