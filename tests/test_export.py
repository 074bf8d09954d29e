"""flowrl export: a checkpoint as a folder to hand on (LoRA folder and kohya file, or the trained transformer;
the resolved recipe; a sample grid; a model card whose fields come from the run), and the hub upload's refusals.
No test uploads anything: the network case points the hub client at a closed local port."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import tiny_recipe
from safetensors.torch import load_file
from served import free_port

from flowrl.cli.main import main as flowrl
from flowrl.config.recipe import recipe_from_dict
from flowrl.trainer import Trainer
from flowrl.trainer.runfolder import read_metrics


def front_matter(card: str) -> dict[str, Any]:
    """The card's YAML front matter (written as `key: <JSON value>` lines, which YAML reads the same)."""
    assert card.startswith("---\n")
    lines = card.split("---")[1].strip().splitlines()
    return {k: json.loads(v) for k, _, v in (line.partition(": ") for line in lines)}


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two LoRA iterations of the tiny FLUX from a saved folder whose model card names a licence."""
    from flowrl.backbones.flux.tiny import TinyFluxSpec, save_tiny_flux

    tmp = tmp_path_factory.mktemp("export")
    save_tiny_flux(TinyFluxSpec(image_size=16, pixel_space=False, num_layers=1, num_single_layers=1), tmp / "base")
    (tmp / "base" / "README.md").write_text("---\nlicense: mit\ntags: [test]\n---\n# a base\n")
    data = tiny_recipe(eval_every=1, checkpoint_every=1)
    data["backbone"] = {"type": "flux", "path": str(tmp / "base"), "resolution": 16, "max_sequence_length": 16,
                        "dtype": "float32"}
    data["prompts"]["heldout"] = ["a dog", "two blue squares", "a red circle"]  # a standard error needs two
    data["lora"] = {"rank": 4, "alpha": 8.0}
    data["optim"] = {"lr": 1e-2}
    Trainer(recipe_from_dict(data), tmp / "run", quiet=True).run()
    return tmp / "run"


def test_a_lora_run_exports_its_weights_recipe_samples_and_card(lora_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "hand-on"
    assert flowrl(["export", str(lora_run), "--out", str(out), "--full-weights", "--prompt", "a red circle",
                   "--prompt", "a cat", "--per-prompt", "2"]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == ["README.md", "base", "flowrl_export.json", "lora", "lora_kohya.safetensors", "recipe.toml",
                     "samples.png", "transformer"]  # base/: the local base, which another machine does not have
    assert not list(tmp_path.glob(".*partial"))
    card = (out / "README.md").read_text()
    matter = front_matter(card)
    assert matter["license"] == "mit" and "base_model" not in matter  # a local folder is no hub id
    assert matter["library_name"] == "diffusers" and matter["pipeline_tag"] == "text-to-image"
    assert {"flowrl", "lora", "tiny"} <= set(matter["tags"])
    rows = {r["step"]: r for r in read_metrics(lora_run / "metrics.jsonl") if "eval/score" in r}
    assert f"| `eval/score` | {rows[0]['eval/score']:.3f} | {rows[2]['eval/score']:.3f} |" in card
    assert f"| {rows[2]['eval/score'] - rows[0]['eval/score']:+.3f} |" in card
    assert "`eval/score`: a mean alone; the reward reports no per-prompt spread" in card  # JPEG: no _se figure
    assert "1. a red circle\n2. a cat" in card and "pipe.load_lora_weights" in card
    saved = tomllib.loads((lora_run / "checkpoints" / "step_000002" / "recipe.toml").read_text())
    exported = tomllib.loads((out / "recipe.toml").read_text())
    assert exported == {**saved, "backbone": {**saved["backbone"], "path": "base"}}  # the shipped base
    kohya = load_file(out / "lora_kohya.safetensors")
    assert any(k.endswith(".lora_down.weight") for k in kohya)
    from PIL import Image

    with Image.open(out / "samples.png") as grid:  # 2 rows of 2 tiles of 16 px, upscaled 4x, 1 px gutters
        assert grid.size[0] > grid.size[1] // 2 > 0


def test_the_merged_transformer_gives_the_lora_policys_velocity(lora_run: Path, tmp_path: Path) -> None:
    """--full-weights: the base's transformer with the LoRA merged in (alpha / rank = 2 included) predicts what the
    trained policy predicts, within float32 rounding of the merged product."""
    from diffusers import FluxTransformer2DModel

    from flowrl.export.loading import load_policy

    out = tmp_path / "full"
    assert flowrl(["export", str(lora_run), "--out", str(out), "--full-weights", "--per-prompt", "0"]) == 0
    assert not (out / "samples.png").exists() and "## Samples" not in (out / "README.md").read_text()
    trained = load_policy(lora_run)
    base = load_policy(lora_run / "checkpoints" / "step_000002")  # a second copy to receive the merged weights
    merged = FluxTransformer2DModel.from_pretrained(out, subfolder="transformer")
    base.backbone.transformer.unload_lora()
    base.backbone.transformer.load_state_dict(merged.state_dict())
    x = trained.backbone.noise(2, torch.Generator().manual_seed(0))
    prompts, s = ["a red circle", "a cat"], torch.tensor([0.8, 0.4])
    cond, base_cond = trained.backbone.encode(prompts), base.backbone.encode(prompts)
    with torch.no_grad():
        ours, theirs = trained.backbone.velocity(x, s, cond), base.backbone.velocity(x, s, base_cond)
    scale = float(ours.abs().max())
    assert float((ours - theirs).abs().max()) <= 1e-5 * scale
    with torch.no_grad():
        base.backbone.transformer.load_state_dict(FluxTransformer2DModel.from_pretrained(
            lora_run.parent / "base", subfolder="transformer").state_dict())
        untrained = base.backbone.velocity(x, s, base_cond)
    assert float((ours - untrained).abs().max()) > 1e-3 * scale  # the LoRA matters: the test can fail


def test_a_full_fine_tuning_run_exports_its_transformer(tmp_path: Path) -> None:
    from diffusers import FluxTransformer2DModel

    Trainer(recipe_from_dict(tiny_recipe()), tmp_path / "run", quiet=True).run()
    out = tmp_path / "out"
    assert flowrl(["export", str(tmp_path / "run"), "--out", str(out)]) == 0
    card = (out / "README.md").read_text()
    assert front_matter(card)["license"] == "apache-2.0"  # tiny_flux is flowrl's own model
    assert "no held-out evaluation" in card and "1. a dog" in card  # the held-out prompt draws the grid
    assert "| figure |" not in card and "load only through flowrl" in card  # tiny_flux: built by flowrl's code
    exported = FluxTransformer2DModel.from_pretrained(out, subfolder="transformer").state_dict()
    saved = load_file(tmp_path / "run" / "checkpoints" / "step_000002" / "weights.safetensors")
    assert saved and all(torch.equal(exported[k], v) for k, v in saved.items())


def test_the_card_gives_the_worlds_figures_with_their_intervals(tmp_path: Path) -> None:
    """The embedded world's verifier reports standard errors: each figure at step 0 and at the checkpoint, with
    its 95% interval, read from metrics.jsonl."""
    from flowrl.config.recipe import load_recipe
    from flowrl.trainer import train

    recipe = load_recipe(Path(__file__).parents[1] / "recipes" / "flow_grpo.toml", [
        "trainer.max_steps=1", "trainer.eval_every=1", "trainer.eval_prompts=8", "trainer.prompts_per_step=2",
        "sampler.group_size=2", "trainer.kl_every=0"])
    run = train(recipe, tmp_path / "run", quiet=True)
    out = tmp_path / "out"
    assert flowrl(["export", str(run), "--out", str(out), "--per-prompt", "1"]) == 0
    card = (out / "README.md").read_text()
    rows = {r["step"]: r for r in read_metrics(run / "metrics.jsonl") if "eval/strict" in r}
    for key in ("eval/strict", "eval/score"):
        cells = []
        for step in (0, 1):
            mean, se = rows[step][key], rows[step][f"{key}_se"]
            cells.append(f"{mean:.3f} ± {se:.3f} [{mean - 1.959964 * se:.3f}, {mean + 1.959964 * se:.3f}]")
        assert f"| `{key}` | {cells[0]} | {cells[1]} |" in card
    assert "a mean alone" not in card.split("## Samples")[0].split("`eval/strict`")[0]


def test_refusals_are_one_line_and_write_nothing(
    lora_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    cases = [
        (["export", str(lora_run), "--out", str(taken)], "exists and is not empty"),
        (["export", str(lora_run / "recipe.toml"), "--out", str(tmp_path / "a")], "expected a folder"),
        (["export", str(lora_run), "--out", str(tmp_path / "b"), "--push-to-hub", "noslash"], "OWNER/NAME"),
        (["export", str(lora_run), "--out", str(tmp_path / "c"), "--push-to-hub", "me/x"], "HF_HUB_OFFLINE is set"),
    ]
    for argv, why in cases:
        capsys.readouterr()
        assert flowrl(argv) == 2, argv
        err = capsys.readouterr().err
        assert why in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert (taken / "keep.txt").read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == ["taken"]
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # no stored token either
    import huggingface_hub.constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_TOKEN_PATH", str(tmp_path / "hf" / "token"))
    monkeypatch.setattr(hub_constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "hf" / "stored_tokens"))
    assert flowrl(["export", str(lora_run), "--out", str(tmp_path / "d"), "--push-to-hub", "me/x"]) == 2
    assert "no Hugging Face token" in capsys.readouterr().err and not (tmp_path / "d").exists()
    # a token but no hub to reach: the folder is written, the upload fails in one line
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
    monkeypatch.setattr(hub_constants, "ENDPOINT", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    out = tmp_path / "e"
    assert flowrl(["export", str(lora_run), "--out", str(out), "--per-prompt", "0", "--push-to-hub", "me/x"]) == 2
    err = capsys.readouterr().err
    assert "the upload failed" in err and "Traceback" not in err and (out / "README.md").is_file()


def test_no_exported_file_names_a_path_of_this_machine(
    lora_run: Path, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The recipe's absolute paths (the base's folder, a LoRA to start from), the configs' `_name_or_path` and the
    card's base are scrubbed: no file holds the run's, the base's or this checkout's absolute path."""
    import sys

    from conftest import ROOT

    data = tiny_recipe(max_steps=1, checkpoint_every=1)
    data["backbone"] = tomllib.loads((lora_run / "recipe.toml").read_text())["backbone"]
    data["lora"] = {"init": str(lora_run / "checkpoints" / "step_000002" / "lora")}  # an absolute path
    Trainer(recipe_from_dict(data), tmp_path / "run", quiet=True).run()
    out = tmp_path / "out"
    assert flowrl(["export", str(tmp_path / "run"), "--out", str(out), "--full-weights", "--per-prompt", "1"]) == 0
    local = {str(tmp_path_factory.getbasetemp()), str(ROOT), sys.prefix, str(Path.home())}
    files = [p for p in out.rglob("*") if p.is_file()]
    for file in files:
        found = [path for path in local if path.encode() in file.read_bytes()]
        assert not found, (file, found)
    assert len(files) > 20  # the base's files (its configs among them) were scanned too
    recipe = tomllib.loads((out / "recipe.toml").read_text())
    assert recipe["backbone"]["path"] == "base" and recipe["lora"]["init"] == "lora"  # the file's name, said so
    assert '# lora.init = "lora": was an absolute path' in (out / "recipe.toml").read_text()


def headings(card: str) -> list[str]:
    """The card's markdown headings, outside fenced code blocks."""
    fenced, found = False, []
    for line in card.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            found.append(line)
    return found


def test_pasted_suite_headings_sit_under_the_cards_own(lora_run: Path, tmp_path: Path) -> None:
    """`flowrl suite run` writes its comparison with an H1 and H2s; under the card's H2 they become H3 and H4, so
    the card has one H1 and no heading deeper than one below the one before it."""
    import shutil

    run = shutil.copytree(lora_run, tmp_path / "run")
    (run / "suites" / "comparison-world").mkdir(parents=True)
    (run / "suites" / "comparison-world" / "comparison.md").write_text(
        "# Suite world\n\n## pinned protocol (comparable with published figures)\n\n| figure | base | run |\n"
        "| --- | --- | --- |\n| strict | 0.3 | 0.4 |\n")
    out = tmp_path / "out"
    assert flowrl(["export", str(run), "--out", str(out), "--per-prompt", "0"]) == 0
    found = headings((out / "README.md").read_text())
    levels = [len(h) - len(h.lstrip("#")) for h in found]
    assert levels[0] == 1 and levels.count(1) == 1, found
    assert all(b <= a + 1 for a, b in zip(levels, levels[1:], strict=False)), found
    at = found.index("## Evaluation suites")
    assert found[at + 1:at + 3] == ["### Suite world", "#### pinned protocol (comparable with published figures)"]
    from flowrl.export.card import demote_headings

    fenced = "## A\n\n```bash\n# a comment\n```\n### B"
    assert demote_headings(fenced, 3) == "### A\n\n```bash\n# a comment\n```\n#### B"
    assert demote_headings("#### deep\n", 3) == "#### deep\n"  # already below: unchanged


def test_full_weights_on_a_full_fine_tune_says_there_is_nothing_to_merge(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    Trainer(recipe_from_dict(tiny_recipe(max_steps=1, checkpoint_every=1)), tmp_path / "run", quiet=True).run()
    capsys.readouterr()
    out = tmp_path / "out"
    assert flowrl(["export", str(tmp_path / "run"), "--out", str(out), "--full-weights", "--per-prompt", "0"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--full-weights" in err[0] and "no LoRA to merge" in err[0], err
    assert (out / "transformer").is_dir() and not (out / "lora").exists()


def test_best_at_step_0_is_called_the_initial_weights(tmp_path: Path) -> None:
    """A run whose evaluations never beat step 0's keeps the initial weights as checkpoints/best: exported, the card
    says they are the initial weights, not fine-tuned ones."""
    data = tiny_recipe(max_steps=1, eval_every=1)
    data["optim"] = {"lr": 1e-30}  # a step that changes nothing the evaluation can see
    Trainer(recipe_from_dict(data), tmp_path / "run", quiet=True).run()
    assert json.loads((tmp_path / "run" / "checkpoints" / "best" / "trainer_state.json").read_text())["step"] == 0
    out = tmp_path / "out"
    assert flowrl(["export", str(tmp_path / "run"), "--checkpoint", "best", "--out", str(out), "--per-prompt",
                   "0"]) == 0
    card = (out / "README.md").read_text()
    assert "fine-tuned transformer" not in card and "trained by reinforcement learning" not in card
    assert "# tiny (initial weights)" in card
    assert "**These are the initial weights of the base `tiny_flux`, not fine-tuned ones.**" in card
    assert "`best` is its step 0: no later evaluation improved on the initial policy" in card


def test_a_full_disk_during_an_export_is_one_line_and_leaves_nothing(
    lora_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch and safetensors writers name no cause: the disk is named when it is all but full (here, by the
    error's own errno), the staging folder is gone, and --out is not made."""
    import errno

    from flowrl.export import folder

    def full(loaded: Any, staging: Path, full_weights: bool) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(staging / "lora"))

    monkeypatch.setattr(folder, "_write_weights", full)
    out = tmp_path / "out"
    assert flowrl(["export", str(lora_run), "--out", str(out), "--per-prompt", "0"]) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("note:")]
    assert len(err) == 1 and "the disk is full" in err[0] and "export again" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # neither out nor .out.partial
