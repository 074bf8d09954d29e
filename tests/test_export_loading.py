"""An exported folder loads: the model card's code runs as written in it for every base (a diffusers pipeline
where one can load the weights, flowrl's commands where none can), and flowrl's commands take the folder as they
take the run (equal samples and figures). Offline, on the tiny local twins; nothing is downloaded."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, tiny_recipe

from flowrl.cli.main import main as flowrl
from flowrl.config.recipe import recipe_from_dict
from flowrl.trainer import Trainer

SMALL = {"resolution": 16, "max_sequence_length": 16, "dtype": "float32"}


def saved_base(kind: str, folder: Path) -> dict[str, Any]:
    """A tiny twin of ``kind`` saved into ``folder`` (as the tests of each base build it); its backbone table."""
    if kind == "flux":
        from flowrl.backbones.flux.tiny import TinyFluxSpec, save_tiny_flux

        save_tiny_flux(TinyFluxSpec(image_size=16, pixel_space=False, num_layers=1, num_single_layers=1), folder)
    elif kind == "sd3":
        from flowrl.backbones.sd3.tiny import TinySD3Spec, save_tiny_sd3

        save_tiny_sd3(TinySD3Spec(image_size=16), folder)
    elif kind == "qwen_image":
        from flowrl.backbones.qwen_image.tiny import TinyQwenImageSpec, save_tiny_qwen_image

        save_tiny_qwen_image(TinyQwenImageSpec(image_size=16), folder)
    elif kind == "flux2":
        from flowrl.backbones.flux2.tiny import TinyFlux2Spec, save_tiny_flux2

        save_tiny_flux2(TinyFlux2Spec(variant="dev", image_size=16), folder)
    else:
        from flowrl.backbones.wan.tiny import TinyWanSpec, save_tiny_wan

        save_tiny_wan(TinyWanSpec(), folder)
        return {"type": "wan", "path": str(folder), "num_frames": 5, **SMALL}
    return {"type": kind, "path": str(folder), **SMALL}


def train(run: Path, backbone: dict[str, Any] | None = None, lora: bool = True, **trainer: Any) -> Path:
    """One iteration (a checkpoint) of the tiny recipe on ``backbone`` (default: the tiny random FLUX)."""
    data = tiny_recipe(max_steps=1, checkpoint_every=1, **trainer)
    data["sampler"]["group_size"] = 2
    data["selector"]["units"] = [[0, 1]]
    if backbone is not None:
        data["backbone"] = backbone
    if lora:
        data["lora"] = {"rank": 4, "alpha": 8.0}
        data["optim"] = {"lr": 1e-2}
    Trainer(recipe_from_dict(data), run, quiet=True).run()
    return run


def block(card: str, language: str) -> str:
    """The card's fenced block in ``language`` (exactly one)."""
    found = re.findall(rf"^```{language}\n(.*?)^```$", card, flags=re.S | re.M)
    assert len(found) == 1, card
    return str(found[0])


def run_card_python(folder: Path, env: dict[str, str] | None = None) -> None:
    """The card's Python block, executed as written in ``folder`` by a fresh interpreter, offline."""
    code = block((folder / "README.md").read_text(), "python")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    done = subprocess.run([sys.executable, "-c", code], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


BASES = ["flux", pytest.param("sd3", marks=pytest.mark.slow), pytest.param("qwen_image", marks=pytest.mark.slow),
         pytest.param("flux2", marks=pytest.mark.slow), pytest.param("wan", marks=pytest.mark.slow)]


@pytest.mark.parametrize("kind", BASES)
def test_the_cards_diffusers_code_runs_for_each_base(kind: str, tmp_path: Path) -> None:
    """A LoRA on a local base: the base ships in base/, and the card's code loads it with the LoRA and samples."""
    run = train(tmp_path / "run", saved_base(kind, tmp_path / "model"))
    out = tmp_path / "out"
    assert flowrl(["export", str(run), "--out", str(out), "--per-prompt", "1"]) == 0
    shutil.rmtree(tmp_path / "model")  # the code needs nothing outside the folder
    run_card_python(out)
    assert (out / ("sample.gif" if kind == "wan" else "sample.png")).stat().st_size > 0
    card = (out / "README.md").read_text()
    assert "load only through flowrl" not in card and 'load_lora_weights("lora")' in card


def test_the_cards_code_loads_a_full_fine_tune_with_a_hub_base(tmp_path: Path) -> None:
    """A base read from the hub cache is named by its hub id (not shipped): the card loads it by that id (here from
    a local cache, offline) with the trained transformer."""
    snapshot = tmp_path / "hub" / "models--flowrl-test--tiny-flux" / "snapshots" / ("0" * 40)
    table = saved_base("flux", snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0" * 40)
    run = train(tmp_path / "run", table, lora=False)
    out = tmp_path / "out"
    assert flowrl(["export", str(run), "--out", str(out), "--per-prompt", "0"]) == 0
    run_card_python(out, {"HF_HUB_CACHE": str(tmp_path / "hub")})
    assert (out / "sample.png").stat().st_size > 0
    card = (out / "README.md").read_text()
    assert not (out / "base").exists() and 'base_model: "flowrl-test/tiny-flux"' in card
    assert 'FluxPipeline.from_pretrained("flowrl-test/tiny-flux", transformer=transformer' in card
    assert 'path = "flowrl-test/tiny-flux"' in (out / "recipe.toml").read_text()


def test_the_worlds_model_loads_through_flowrl_as_the_card_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    """The embedded world's model is pixel-space FLUX: no diffusers pipeline decodes it, and the card says so and
    gives flowrl's commands, which run as written in the folder."""
    from flowrl.config.recipe import load_recipe
    from flowrl.trainer import train as run_training

    recipe = load_recipe(ROOT / "recipes" / "flow_grpo.toml", [
        "trainer.max_steps=1", "trainer.eval_every=0", "trainer.prompts_per_step=1", "sampler.group_size=2",
        "trainer.kl_every=0", "trainer.checkpoint_every=1", "prompts.eval_count=5", "trainer.eval_steps=4"])
    run = run_training(recipe, tmp_path / "run", quiet=True)
    out = tmp_path / "out"
    assert flowrl(["export", str(run), "--out", str(out), "--per-prompt", "0"]) == 0
    card = (out / "README.md").read_text()
    assert "**These weights load only through flowrl**" in card and "no VAE" in card
    assert "```python" not in card and not (out / "base").exists()
    monkeypatch.chdir(out)
    commands = [shlex.split(line) for line in block(card, "bash").splitlines() if line.startswith("flowrl ")]
    assert [c[:2] for c in commands] == [["flowrl", "sample"], ["flowrl", "eval"]]
    for command in commands:
        assert flowrl(command[1:]) == 0, command
    assert (out / "sample.png").stat().st_size > 0


def _outputs(path: Path, tmp: Path, capsys: pytest.CaptureFixture[str]) -> tuple[bytes, dict[str, Any]]:
    """``flowrl sample`` (the PNG's bytes) and ``flowrl eval --json`` (the figures) of ``path``."""
    png = tmp / f"{path.name}.png"
    assert flowrl(["sample", str(path), "--prompt", "a red circle", "--prompt", "a cat", "--per-prompt", "2",
                   "--out", str(png)]) == 0
    capsys.readouterr()
    assert flowrl(["eval", str(path), "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    return png.read_bytes(), figures


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_sample_and_eval_take_an_exported_folder_as_they_take_the_run(
    lora: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exact: the folder holds the checkpoint's tensors (the LoRA as written, or the transformer with the trained
    tensors bit for bit) and the same recipe, so the same code draws the same samples and figures."""
    backbone = saved_base("flux", tmp_path / "model") if lora else None  # LoRA: a shipped base; full: tiny_flux
    run = train(tmp_path / "run", backbone, lora=lora, eval_every=0)
    out = tmp_path / "out"
    assert flowrl(["export", str(run), "--out", str(out), "--per-prompt", "0", "--full-weights"]) == 0
    png, figures = _outputs(run, tmp_path, capsys)
    suites, prompts = tmp_path / "suites", tmp_path / "prompts.txt"  # a suite column of the folder equals the run's
    prompts.write_text("a red circle\ntwo blue squares\n")
    assert flowrl(["suite", "run", "drawbench", str(run), str(out), "--tag", "run", "--tag", "export",
                   "--out", str(suites), "--quiet", "--set", f"prompts={str(prompts)!r}", "--set",
                   'scorers=[{type="jpeg_compressibility"}]', "--protocol", "steps=2"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    made = [sorted((suites / tag / "drawbench" / "images").iterdir()) for tag in ("run", "export")]
    assert [p.name for p in made[0]] == [p.name for p in made[1]] and made[0]
    assert all(a.read_bytes() == b.read_bytes() for a, b in zip(*made, strict=True))
    shutil.move(out, tmp_path / "moved")  # the folder opens wherever it is
    if lora:
        shutil.rmtree(tmp_path / "model")  # and needs no file outside it
    exported_png, exported_figures = _outputs(tmp_path / "moved", tmp_path, capsys)
    assert figures["step"] == 1 and exported_figures == figures
    assert exported_png == png
    refused = [["eval", str(tmp_path / "moved"), "--checkpoint", "best"],
               ["export", str(tmp_path / "moved"), "--out", str(tmp_path / "again")]]
    if not lora:  # no optimizer or trainer state to resume from: refused in one line
        recipe = str(run / "checkpoints" / "step_000001" / "recipe.toml")
        refused.append(["train", recipe, "--resume", str(tmp_path / "moved"), "--output-dir", str(tmp_path / "r")])
    for command in refused:
        assert flowrl(command) == 2
        err = capsys.readouterr().err
        assert "exported folder" in err and len(err.strip().splitlines()) == 1, err
