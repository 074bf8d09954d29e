"""An exported conditioned model (an edit base): what the card says it takes, and the source images in the folder.

The base's :meth:`~flowrl.core.interfaces.Backbone.accepts` (a :class:`~flowrl.core.conditions.ConditionSpec`: how many
images, which modes, what each is) goes into the card's facts. The sample prompts' condition images are written
into ``sources/`` as PNGs of their own pixels (``sources/<row>.png``, or ``sources/<row>-<image>.png`` for a
prompt with several), so that the card's ``flowrl sample . --prompt ... --image sources/1.png`` runs as written in
the folder, and the sample grid shows each row's source first (as ``flowrl sample --image`` does). A text-to-image
base writes none of this.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flowrl.core.conditions import Condition, conditions_of
from flowrl.export.facts import Takes

SOURCES = "sources"


def takes(backbone_part: Any) -> Takes:
    """The recipe's backbone part's :class:`~flowrl.core.conditions.ConditionSpec`, asked of its class and config."""
    spec = backbone_part.cls.accepts(backbone_part.config)
    if spec.count[1] == 0:
        return Takes()
    return Takes(tuple(spec.count), tuple(spec.modes), tuple(spec.meaning), spec.describe())


def _png(condition: Condition) -> bytes:
    from PIL import Image

    pixels = condition.pixels if condition.mode != "L" else condition.pixels[:, :, 0]
    buffer = io.BytesIO()
    Image.fromarray(pixels, condition.mode).save(buffer, format="PNG")
    return buffer.getvalue()


def write_sources(prompts: Sequence[str], folder: Path, stems: Sequence[str] = ()) -> tuple[tuple[str, ...], ...]:
    """Each prompt's condition images into ``folder/sources/`` (named by ``stems``, default the rows counted from
    1); their names relative to ``folder``, per prompt (empty for a prompt without any)."""
    names: list[tuple[str, ...]] = []
    for i, prompt in enumerate(prompts):
        stem, conditions = stems[i] if stems else str(i + 1), conditions_of(prompt)
        row = tuple(f"{SOURCES}/{stem}.png" if len(conditions) == 1 else f"{SOURCES}/{stem}-{j}.png"
                    for j in range(1, len(conditions) + 1))
        for name, condition in zip(row, conditions, strict=True):
            (folder / name).parent.mkdir(exist_ok=True)
            (folder / name).write_bytes(_png(condition))
        names.append(row)
    return tuple(names)


Files = tuple[str, ...]  # one prompt's condition images in the folder


def source_files(rows: Sequence[str], example: str, folder: Path) -> tuple[tuple[Files, ...], Files]:
    """Write the sample ``rows``' condition images (``sources/1.png``, ...) and the card example's (its row's, or
    ``sources/example.png`` when it is no row); return the files per row and the example's."""
    per_row = write_sources(rows, folder)
    mine = next((files for prompt, files in zip(rows, per_row, strict=True) if prompt == example), None)
    return per_row, mine if mine is not None else write_sources([example], folder, ["example"])[0]


def with_sources(images: Any, prompts: Sequence[str], per_prompt: int) -> Any:
    """``images`` (``per_prompt`` a prompt, prompt after prompt) with each prompt's first condition image before
    its results, fitted to their size (scaled and centre-cropped; a clip's source repeated over its frames); a
    prompt without one gets a white tile there."""
    import numpy as np
    import torch
    from PIL import Image, ImageOps

    height, width = images.shape[-2:]
    out = []
    for i, prompt in enumerate(prompts):
        results = images[i * per_prompt:(i + 1) * per_prompt]
        tile = torch.ones(3, height, width)
        if conditions_of(prompt):
            condition = conditions_of(prompt)[0]
            pixels = condition.pixels if condition.mode != "L" else condition.pixels[:, :, 0]
            image = ImageOps.fit(Image.fromarray(pixels, condition.mode).convert("RGB"), (width, height),
                                 Image.Resampling.BICUBIC)
            tile = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0).permute(2, 0, 1)
        out += [tile.expand_as(results[0]).to(results), *results]
    return torch.stack(out)
