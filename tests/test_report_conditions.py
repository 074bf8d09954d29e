"""``flowrl report`` of a run whose prompts carry condition images (the edit world): training keeps the held-out
prompts' source images beside the sample strips, and each tile of the page shows source | result with the
instruction as its caption; a text-to-image run writes and shows exactly what it did before."""

from __future__ import annotations

import base64
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, tiny_recipe
from PIL import Image

from flowrl.config.recipe import load_recipe, recipe_from_dict
from flowrl.core.conditions import Condition, Prompt, conditions_of
from flowrl.report.page import STYLE, write_report
from flowrl.report.samples import EDIT_STYLE, sample_table
from flowrl.trainer import train
from flowrl.trainer.logger import SamplePrompts, write_grid

# recipes/edit/egrpo.toml made short: one iteration, three held-out edits, samples at each evaluation
SHORT = ["trainer.max_steps=1", "trainer.prompts_per_step=1", "trainer.train_batch_size=16", "trainer.eval_every=1",
         "trainer.eval_prompts=3", "prompts.eval_count=3", "trainer.image_every=1", "trainer.checkpoint_every=1",
         "trainer.max_minutes=0", "trainer.eval_steps=4"]
IMG = re.compile(r'<img alt="([^"]*)" src="data:image/(\w+);base64,([^"]+)">')


@pytest.fixture(scope="module")
def edit_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    recipe = load_recipe(ROOT / "recipes" / "edit" / "egrpo.toml", SHORT)
    return train(recipe, tmp_path_factory.mktemp("edit") / "run", quiet=True)


def heldout(run: Path) -> list[str]:
    return load_recipe(run / "recipe.toml").build("prompts").heldout()[:3]


def pixels(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def test_training_keeps_the_heldout_sources_beside_the_samples(edit_run: Path) -> None:
    samples = edit_run / "samples"
    prompts = heldout(edit_run)
    assert (samples / "prompts.txt").read_text().splitlines() == [str(p) for p in prompts]
    manifest = json.loads((samples / "conditions.json").read_text())
    assert manifest == {"meaning": ["the source image"], "prompts": [[f"conditions/{i}-1.png"] for i in (1, 2, 3)]}
    for i, prompt in enumerate(prompts, 1):  # each source as its own pixels, once (not one per evaluation)
        (source,) = conditions_of(prompt)
        assert np.array_equal(pixels((samples / "conditions" / f"{i}-1.png").read_bytes()), source.pixels)
    assert sorted(p.name for p in (samples / "conditions").iterdir()) == ["1-1.png", "2-1.png", "3-1.png"]
    checkpoint = edit_run / "checkpoints" / "step_000001"  # the checkpoint's sample row has them too
    assert (checkpoint / "conditions.json").read_text() == (samples / "conditions.json").read_text()


def test_each_tile_shows_source_and_result_with_the_instruction(edit_run: Path, tmp_path: Path) -> None:
    page = write_report(edit_run, tmp_path / "report.html").read_text()
    assert f"<style>{STYLE}{EDIT_STYLE}</style>" in page
    figures = re.findall(r'<figure class="edit">(.*?)</figure>', page)
    prompts = heldout(edit_run)
    assert len(figures) == 2 * len(prompts)  # evaluations at iterations 0 and 1, a tile per held-out edit
    for k, figure in enumerate(figures):
        prompt = prompts[k % len(prompts)]
        (source_img, result_img) = IMG.findall(figure)
        caption = re.search(r"<figcaption>(.*?)</figcaption>", figure)
        assert caption is not None and caption.group(1) == str(prompt)
        assert source_img[0] == f"the source image: {prompt}" and result_img[0].startswith(f"{prompt} at iteration")
        assert figure.index(source_img[2]) < figure.index("&rarr;") < figure.index(result_img[2])  # source | result
        assert np.array_equal(pixels(base64.b64decode(source_img[2])), conditions_of(prompt)[0].pixels)
        assert pixels(base64.b64decode(result_img[2])).shape == (128, 128, 3)  # the strip's 32 px tile, 4x


def test_a_strip_shown_whole_gets_its_sources_above_it(tmp_path: Path) -> None:
    sources = [Condition(np.full((6, 6, 3), v, np.uint8)) for v in (10, 200)]
    prompts = [Prompt(text, [c]) for text, c in zip(("make it red", "remove it"), sources, strict=True)]
    strip = tmp_path / "run" / "samples" / "step_000003.png"
    write_grid((torch.zeros(2, 3, 8, 8), SamplePrompts(prompts, ["the source"])), strip)
    Image.new("RGB", (50, 20)).save(strip)  # a strip of another layout, which is not cut into tiles
    found: list[tuple[str, bytes]] = []

    def keep(data: bytes, alt: str, kind: str = "png") -> str:
        found.append((alt, data))
        return "<img>"

    html = "\n".join(sample_table(tmp_path / "run", keep))
    assert "<tr><th>the source</th>" in html and 'colspan="2"' in html
    assert [alt for alt, _ in found] == ["the source: make it red", "the source: remove it", "samples at 3"]
    assert [int(pixels(data)[0, 0, 0]) for _, data in found[:2]] == [10, 200]


def test_a_text_to_image_run_writes_and_shows_what_it_did(tmp_path: Path) -> None:
    """No condition file beside the samples or in a checkpoint, and the page's samples as before: plain tiles
    under their prompts, the page's style alone (tests/test_report.py checks the rest of that page)."""
    data = tiny_recipe(max_steps=1, eval_every=1, eval_prompts=1, image_every=1, checkpoint_every=1)
    run = train(recipe_from_dict(data), tmp_path / "run", quiet=True)
    assert sorted(p.name for p in (run / "samples").iterdir()) == ["prompts.txt", "step_000000.png", "step_000001.png"]
    assert sorted(p.name for p in (run / "checkpoints" / "step_000001").iterdir()) == [
        "extra.pt", "prompts.txt", "recipe.toml", "samples.png", "trainer_state.json", "weights.safetensors"]
    page = write_report(run, tmp_path / "report.html").read_text()
    assert f"<style>{STYLE}</style>" in page and "figure" not in page.split("Held-out samples")[1]
    rows = re.findall(r"<tr><th>iteration (\d+)</th>(.*?)</tr>", page)
    assert [step for step, _ in rows] == ["0", "1"]
    for step, cells in rows:
        assert re.fullmatch(rf'<td><img alt="a dog at iteration {step}" src="data:image/png;base64,[^"]+"></td>',
                            cells)
