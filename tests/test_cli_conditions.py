"""Conditions through the commands besides ``flowrl train``: ``flowrl sample --image`` on the edit base (the
grid shows each source before its results), its refusals (one line, exit 2, before the model loads), and
``flowrl eval`` / ``flowrl profile`` on edit recipes, the conditions coming from the prompt source."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT
from PIL import Image
from test_cli import flowrl_cli

EDIT = str(ROOT / "recipes" / "edit" / "egrpo.toml")
TEXT = str(ROOT / "recipes" / "egrpo.toml")
SMALL = ("--set", "prompts.eval_count=5", "--set", "trainer.eval_steps=4")  # 5 held-out sources, not 250; 4 steps


def sources(folder: Path, n: int = 2) -> list[tuple[str, Path]]:
    """The first ``n`` held-out edits of the edit world: (instruction, its source saved as a PNG)."""
    import flowrl
    from flowrl.core.conditions import conditions_of

    out = []
    for i, prompt in enumerate(flowrl.build("prompts", {"type": "world_edit", "eval_count": 5}).heldout()[:n]):
        (source,) = conditions_of(prompt)
        path = folder / f"source{i}.png"
        Image.fromarray(np.asarray(source.pixels), source.mode).save(path)
        out.append((str(prompt), path))
    return out


def tile(grid: np.ndarray, row: int, column: int, side: int = 32, scale: int = 4, gap: int = 1) -> np.ndarray:
    """One tile of a grid written by ``flowrl sample`` (tiles ``gap`` pixels apart, upscaled ``scale`` times)."""
    y, x = row * (side + gap) * scale, column * (side + gap) * scale
    return grid[y : y + side * scale : scale, x : x + side * scale : scale]


def test_sample_pairs_each_image_with_its_prompt_and_shows_sources_first(tmp_path: Path) -> None:
    (text0, path0), (text1, path1) = sources(tmp_path)
    out = flowrl_cli("sample", EDIT, *SMALL, "--prompt", text0, "--image", str(path0), "--prompt", text1,
                     "--image", str(path1), "--per-prompt", "2", "--out", str(tmp_path / "grid.png"))
    assert out.returncode == 0, out.stderr
    assert "wrote" in out.stdout and "the first column: each prompt's --image" in out.stdout
    grid = np.asarray(Image.open(tmp_path / "grid.png").convert("RGB"))
    assert grid.shape == ((2 * 32 + 1) * 4, (3 * 32 + 2) * 4, 3)  # 2 prompts; the source, then 2 results
    for row, path in enumerate((path0, path1)):
        assert np.array_equal(tile(grid, row, 0), np.asarray(Image.open(path)))  # the i-th --image, i-th row
        assert not np.array_equal(tile(grid, row, 1), tile(grid, row, 0))  # a result, not the source copied
    # the source is the model's input: the results differ from those of the same prompt on the other source
    swapped = flowrl_cli("sample", EDIT, *SMALL, "--prompt", text0, "--image", str(path1), "--per-prompt", "1",
                         "--out", str(tmp_path / "swapped.png"))
    assert swapped.returncode == 0, swapped.stderr
    other = np.asarray(Image.open(tmp_path / "swapped.png").convert("RGB"))
    assert np.array_equal(tile(other, 0, 0), np.asarray(Image.open(path1)))
    assert not np.array_equal(tile(other, 0, 1), tile(grid, 0, 1))


def test_one_image_serves_every_prompt(tmp_path: Path) -> None:
    ((_, path),) = sources(tmp_path, 1)
    out = flowrl_cli("sample", EDIT, *SMALL, "--prompt", "remove the red square", "--prompt", "make it two red"
                     " squares", "--image", str(path), "--per-prompt", "1", "--out", str(tmp_path / "grid.png"))
    assert out.returncode == 0, out.stderr
    grid = np.asarray(Image.open(tmp_path / "grid.png").convert("RGB"))
    assert grid.shape == ((2 * 32 + 1) * 4, (2 * 32 + 1) * 4, 3)
    for row in (0, 1):
        assert np.array_equal(tile(grid, row, 0), np.asarray(Image.open(path)))


def bad_image(folder: Path, kind: str) -> Path:
    path = folder / f"{kind}.png"
    if kind == "text":
        path.write_text("not an image")
    elif kind in ("RGB", "RGBA"):
        Image.new(kind, (32, 32)).save(path)
    return path  # "missing": not written


@pytest.mark.parametrize(
    ("recipe", "image", "message"),
    [
        (EDIT, "missing", "error: argument --image: {path}: no such file (image paths are relative to the working"
         " directory)"),
        (EDIT, "text", "error: argument --image: {path}: not an image PIL can read (PNG, JPEG, WebP, ...)"),
        (EDIT, "RGBA", "error: --image: image {path} is RGBA; the backbone 'world_edit_tiny' takes RGB images (drop"
         " the alpha channel)"),
        (EDIT, None, "error: --image: the backbone 'world_edit_tiny' takes exactly 1 image (the source image) with"
         " each prompt; give it with --image PATH"),
        (TEXT, "RGB", "error: --image: the backbone 'world_tiny' takes none (a text-to-image base); leave out"
         " --image"),
    ],
    ids=["missing", "not-an-image", "rgba", "edit-base-without-image", "text-base-with-image"],
)
def test_a_bad_image_is_one_line_and_exit_2(tmp_path: Path, recipe: str, image: str | None, message: str) -> None:
    given = ["--image", str(bad_image(tmp_path, image))] if image else []
    out = flowrl_cli("sample", recipe, "--prompt", "remove the red square", *given, "--out", str(tmp_path / "s.png"),
                     cwd=tmp_path)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert lines[0].startswith(message.format(path=tmp_path / f"{image}.png")), lines[0]
    assert "using the initial policy" not in out.stderr and not (tmp_path / "s.png").exists()


def test_images_and_prompts_that_do_not_pair_are_refused(tmp_path: Path) -> None:
    image = str(bad_image(tmp_path, "RGB"))
    out = flowrl_cli("sample", EDIT, "--prompt", "a", "--prompt", "b", "--prompt", "c", "--image", image,
                     "--image", image, "--out", str(tmp_path / "s.png"))
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0, out.stderr
    assert "error: --image: given 2 times for 3 --prompt; give one --image for every prompt, or one per" in out.stderr


def edit_prompt_file(folder: Path, mode: str) -> Path:
    """An edit recipe whose prompts are a JSONL file (train and held out): an edit world's edit, its source saved
    in ``mode``."""
    ((text, path),) = sources(folder, 1)
    Image.open(path).convert(mode).save(folder / "source.png")
    (folder / "edits.jsonl").write_text(json.dumps({"prompt": text, "image": "source.png"}) + "\n")
    text = Path(EDIT).read_text().replace(
        'type = "world_edit"', 'type = "jsonl"\npath = "edits.jsonl"\nheldout_path = "edits.jsonl"\n#', 1
    ).replace("\neval_count = ", "\n# eval_count = ", 1)  # a world_edit setting the prompt file does not take
    recipe = folder / f"edit_{mode}.toml"
    recipe.write_text(text)
    return recipe


def test_eval_on_the_edit_world_and_a_prompt_files_sources_checked_before_the_model(tmp_path: Path) -> None:
    out = flowrl_cli("eval", EDIT, *SMALL, "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["prompts"] == 5 and 0 <= result["strict"] <= 1 and "strict/remove" in result  # the verifier's
    good = flowrl_cli("eval", str(edit_prompt_file(tmp_path, "RGB")), *SMALL[2:], "--json", cwd=tmp_path)
    assert good.returncode == 0 and json.loads(good.stdout)["prompts"] == 1, good.stderr
    # an RGBA source stopped the edit base's forward with a traceback (a size mismatch); now it is refused as
    # flowrl train refuses it, before the model loads
    bad = flowrl_cli("eval", str(edit_prompt_file(tmp_path, "RGBA")), cwd=tmp_path)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr
    assert bad.stderr.strip() == (
        "error: [prompts.path] prompt file edits.jsonl, record 1 (line 1): image source.png is RGBA; the backbone"
        " 'world_edit_tiny' takes RGB images (drop the alpha channel)"
    )


def test_profile_on_the_edit_world_and_a_prompt_files_sources_checked_before_the_model(tmp_path: Path) -> None:
    out = flowrl_cli("profile", EDIT, *SMALL, "--set", "schedule.num_steps=4", "--prompts", "2", "--group-size", "2",
                     "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["prompts"] == 2 and result["group_size"] == 2 and len(result["steps"]) == 4
    bad = flowrl_cli("profile", str(edit_prompt_file(tmp_path, "RGBA")), "--prompts", "1", cwd=tmp_path)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr
    assert "image source.png is RGBA; the backbone 'world_edit_tiny' takes RGB images" in bad.stderr
