"""``flowrl export`` of an edit base (the edit world): the model card says it is an editing model taking a source
image (from the base's ``accepts()``), its usage passes one (``flowrl sample ... --image sources/1.png``, a file the
folder holds), and the sample grid starts each row with its source. A text-to-image card stays as it was
(tests/test_export.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest
from conftest import ROOT
from PIL import Image

from flowrl.config.recipe import load_recipe
from flowrl.core.conditions import conditions_of
from flowrl.export.card import model_card
from flowrl.export.facts import CardFacts, Takes
from flowrl.export.folder import export_checkpoint
from flowrl.trainer import train

SHORT = ["trainer.max_steps=1", "trainer.prompts_per_step=1", "trainer.train_batch_size=16", "trainer.eval_every=1",
         "trainer.eval_prompts=3", "prompts.eval_count=3", "trainer.image_every=0", "trainer.checkpoint_every=1",
         "trainer.max_minutes=0", "trainer.eval_steps=4"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """One iteration of recipes/edit/egrpo.toml, exported with 2 samples a held-out edit; and those edits."""
    tmp = tmp_path_factory.mktemp("export_edit")
    run = train(load_recipe(ROOT / "recipes" / "edit" / "egrpo.toml", SHORT), tmp / "run", quiet=True)
    out = export_checkpoint(run, tmp / "out", per_prompt=2)
    return out, load_recipe(run / "recipe.toml").build("prompts").heldout()[:3]


def front_matter(card: str) -> dict[str, Any]:
    lines = card.split("---")[1].strip().splitlines()
    return {k: json.loads(v) for k, _, v in (line.partition(": ") for line in lines)}


def test_the_card_says_it_edits_and_its_command_passes_the_source(exported: tuple[Path, list[str]]) -> None:
    out, prompts = exported
    card = (out / "README.md").read_text()
    matter = front_matter(card)
    assert matter["pipeline_tag"] == "image-to-image" and "image-editing" in matter["tags"]
    assert matter["license"] == "apache-2.0"  # world_edit_tiny is one of flowrl's own models
    assert ("**This is an image-editing model.** Each prompt is an instruction with exactly 1 image (the source"
            " image), RGB, and the model generates the edited image from both") in card
    assert f'flowrl sample . --prompt "{prompts[0]}" --image sources/1.png --out sample.png' in card
    assert "one `--image` per `--prompt`, in order" in card
    for i, prompt in enumerate(prompts, 1):  # the sample list names each row's source file, which the folder holds
        assert f"{i}. {prompt} (`sources/{i}.png`)" in card
        image = np.asarray(Image.open(out / "sources" / f"{i}.png"))
        assert np.array_equal(image, conditions_of(prompt)[0].pixels)
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "flowrl_export.json", "recipe.toml", "samples.png",
                                                     "sources", "transformer"]


def test_each_row_of_the_sample_grid_starts_with_its_source(exported: tuple[Path, list[str]]) -> None:
    out, prompts = exported
    grid = np.asarray(Image.open(out / "samples.png").convert("RGB"))
    tile, gap, scale = 32, 1, 4  # flowrl.trainer.logger.save_grid_png: 1-pixel gutters, then 4x
    assert grid.shape == ((3 * tile + 2 * gap) * scale, (3 * tile + 2 * gap) * scale, 3)  # 3 rows: source, 2 results
    for row, prompt in enumerate(prompts):
        top = row * (tile + gap) * scale
        first = grid[top:top + tile * scale:scale, 0:tile * scale:scale]
        assert np.array_equal(first, conditions_of(prompt)[0].pixels)


def test_the_cards_usage_for_an_edit_base_and_for_a_text_to_image_one() -> None:
    """From the facts alone: a diffusers-loadable edit base's code loads the source and passes it as ``image=``;
    an example with no source in the folder names the user's own file; a text-to-image card has none of it."""
    plain = CardFacts(
        name="r", base="owner/base", base_is_hub_id=True, licence="mit", licence_note="MIT.", parts={}, rewards=(),
        step=3, iterations=3, nfe=10, eval_steps=4, figures=(), lora=True, full_weights=False,
        pipeline_class="FluxKontextPipeline", transformer_class="FluxTransformer2DModel", video=False,
        sample_prompts=(), sample_file="", loader="diffusers", base_ref="owner/base", example_prompt="make it red")
    edit = attrs.evolve(plain, takes=Takes((1, 1), ("RGB",), ("the source image",), "exactly 1 image (the source"
                                           " image)"), example_images=("sources/example.png",))
    card = model_card(edit)
    assert 'source = load_image("sources/example.png")' in card
    assert 'image = pipe(prompt="make it red", image=source).images[0]' in card
    assert '--prompt "make it red" --image sources/example.png --out sample.png' in card
    assert front_matter(card)["pipeline_tag"] == "image-to-image"
    mine = model_card(attrs.evolve(edit, example_images=()))
    assert "--image SRC.png" in mine and "`SRC.png` stands for your own image" in mine
    text = model_card(plain)
    assert front_matter(text)["pipeline_tag"] == "text-to-image"
    assert "--image" not in text and "load_image" not in text and "editing" not in text
    assert '--prompt "make it red" --out sample.png' in text
