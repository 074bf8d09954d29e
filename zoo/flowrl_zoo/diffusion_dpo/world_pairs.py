"""Small offline preference files from the embedded world. Text-to-image: each record's preferred image is the
world's rendering of its prompt, the rejected one a rendering of another scene (the world's verifier scores the
first high, the second low). Edits (``--edit``): an instruction with its source image as the condition, the
preferred image the edit done, the rejected one the source unchanged.
``python -m flowrl_zoo.diffusion_dpo.world_pairs FOLDER [--pairs N] [--seed S] [--edit]`` writes
``FOLDER/pairs.jsonl`` and ``FOLDER/img/*.png``; recipes/diffusion_dpo_offline.toml trains on the shipped one."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from PIL import Image

from flowrl.world.edit import enumerate_edits
from flowrl.world.edit_render import render_edit
from flowrl.world.grammar import enumerate_scenes
from flowrl.world.render import render


def write_world_pairs(folder: str | Path, pairs: int = 16, seed: int = 0, size: int = 32) -> Path:
    """Write ``pairs`` records (train-split prompts drawn with ``seed``) and their ``size`` px images under
    ``folder``; returns the JSONL file's path. The same arguments write the same bytes."""
    out = Path(folder)
    (out / "img").mkdir(parents=True, exist_ok=True)
    scenes = enumerate_scenes("train")
    rng = np.random.default_rng(seed)
    lines = []
    for k in range(pairs):
        i, j = rng.choice(len(scenes), size=2, replace=False)
        names = {"chosen": f"img/{k:03d}_chosen.png", "rejected": f"img/{k:03d}_rejected.png"}
        for key, scene in (("chosen", scenes[i]), ("rejected", scenes[j])):
            pixels = render(scene, np.random.default_rng((seed, k, key == "chosen")), size)
            Image.fromarray(pixels).save(out / names[key], optimize=True)
        lines.append(json.dumps({"prompt": scenes[i].text, **names}))
    path = out / "pairs.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_world_edit_pairs(folder: str | Path, pairs: int = 16, seed: int = 0, size: int = 32) -> Path:
    """Write ``pairs`` edit records (train-split edits drawn with ``seed``): the instruction, its source image as
    the condition (``"image"``), the edited image preferred to the untouched source; returns the JSONL path."""
    out = Path(folder)
    (out / "img").mkdir(parents=True, exist_ok=True)
    edits = enumerate_edits("train")
    rng = np.random.default_rng(seed)
    lines = []
    for k, i in enumerate(rng.choice(len(edits), size=pairs, replace=False)):
        source, target = render_edit(edits[i], np.random.default_rng((seed, k)), size)
        names = {"chosen": f"img/{k:03d}_edited.png", "rejected": f"img/{k:03d}_source.png"}
        Image.fromarray(target).save(out / names["chosen"], optimize=True)
        Image.fromarray(source).save(out / names["rejected"], optimize=True)
        lines.append(json.dumps({"prompt": edits[i].text, **names, "image": names["rejected"]}))
    path = out / "pairs.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("--pairs", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--edit", action="store_true", help="edit pairs: the source image as the condition")
    args = parser.parse_args(argv)
    write = write_world_edit_pairs if args.edit else write_world_pairs
    print(write(args.folder, args.pairs, args.seed))


if __name__ == "__main__":
    main()
