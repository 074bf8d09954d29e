"""``flowrl pretrain``: the flow-matching pre-training of the world's base model, and the shipped checkpoint."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import attrs
import numpy as np
import pytest
import torch
from conftest import ROOT

import flowrl
from flowrl.cli.main import main
from flowrl.pretrain import Pretrainer, PretrainRecipe, PretrainRecipeError, load_pretrain_recipe, pretrain
from flowrl.pretrain.data import miscaptioned, render_parallel
from flowrl.pretrain.model import build_backbone
from flowrl.pretrain.recipe import EvalConfig, training_device
from flowrl.world import vocabulary
from flowrl.world.components import BASE_MODEL
from flowrl.world.grammar import sample_scenes, scene_split
from flowrl.world.render import Lattice, render_batch

RECIPE = ROOT / "recipes" / "pretrain" / "world_clean.toml"  # stage 1: from random weights
# A very small model and run: 2 pre-training steps per second or better on a shared CPU.
SMALL = [
    "model.num_layers=1",
    "model.num_single_layers=1",
    "model.num_attention_heads=2",
    "model.attention_head_dim=16",
    "model.axes_dims_rope=[4, 6, 6]",
    "model.text_layers=1",
    "train.steps=4",
    "train.batch_size=8",
    "train.pool_size=32",
    "train.warmup_steps=0",
    "train.ema_decay=0.0",
    "train.log_every=2",
    "train.threads=1",
    "eval.every=0",
    "eval.prompts=4",
    "eval.num_steps=2",
]


def _folder_mb(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20


def test_pretrain_saves_a_loadable_world_tiny(tmp_path: Path) -> None:
    recipe = load_pretrain_recipe(RECIPE, SMALL)
    out = tmp_path / "model"
    result = pretrain(recipe, out, quiet=True)
    assert len(result.losses) == 4 and all(math.isfinite(v) for v in result.losses)
    assert len(result.evals) == 1 and 0.0 <= result.evals[0]["test/score"] <= 1.0 and "novel/strict" in result.evals[0]
    backbone = flowrl.build("backbone", {"type": "world_tiny", "path": str(out)})
    assert backbone.pixel_space and backbone.latent_shape == (16, 192)  # 8 x 8-pixel tokens of 3 channels
    initial = build_backbone(recipe.model, recipe.seed).transformer.state_dict()
    changed = [k for k, v in backbone.transformer.state_dict().items() if not torch.equal(v, initial[k])]
    assert changed, "pre-training did not change the transformer's weights"
    images = backbone.decode(backbone.noise(2, torch.Generator().manual_seed(0)))
    assert images.shape == (2, 3, 32, 32)
    # the saved resolved recipe reproduces the one that ran
    assert load_pretrain_recipe(out / "pretrain.toml") == recipe
    # a second stage starts from the saved weights (EMA included); a model of other sizes is refused
    stage2 = Pretrainer(load_pretrain_recipe(RECIPE, [*SMALL, f"init={out}", "train.ema_decay=0.99"]), tmp_path / "s2")
    saved = backbone.transformer.state_dict()
    assert all(torch.equal(v, saved[k]) for k, v in stage2.backbone.transformer.state_dict().items())
    assert stage2.ema is not None and all(
        torch.equal(v, p.detach()) for (_, p), v in zip(stage2.params, stage2.ema.shadow.values(), strict=True)
    )
    with pytest.raises(PretrainRecipeError, match=r"\[init\] does not fit \[model\]: transformer"):
        Pretrainer(load_pretrain_recipe(RECIPE, [*SMALL, f"init={out}", "model.num_layers=2"]), tmp_path / "s3")


def test_loss_decreases_on_a_fixed_batch(tmp_path: Path) -> None:
    overrides = [*SMALL, "train.lr=3e-3", "train.lr_schedule=constant"]
    trainer = Pretrainer(load_pretrain_recipe(RECIPE, overrides), tmp_path, quiet=True)
    trainer.render_pool()
    images, prompts = trainer.batch(0)
    losses = [trainer.train_step(images, prompts, torch.Generator().manual_seed(7)) for _ in range(5)]
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < losses[0], losses


def test_cli_pretrain_runs(tmp_path: Path) -> None:
    out = tmp_path / "cli"
    args = [sys.executable, "-m", "flowrl.cli.main", "pretrain", str(RECIPE), "--output-dir", str(out), "--quiet"]
    for item in [*SMALL, "train.steps=2"]:
        args += ["--set", item]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "test score" in proc.stdout and "novel score" in proc.stdout
    assert (out / "model_index.json").exists() and (out / "transformer").is_dir()


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[train]\nstepz = 3\n", "[train.stepz] unknown key; did you mean 'steps'?"),
        ("[modle]\nnum_layers = 1\n", "[modle] unknown key; did you mean 'model'?"),
        ("[model]\naxes_dims_rope = [4, 4, 4]\n", "[model] axes_dims_rope"),
        ("[train]\nlr = -1.0\n", "[train.lr]"),
        ("[train]\nobject_cells = [3, 2]\n", "[train.object_cells]"),
        ('init = "no/such/model"\n', "[init] no saved pipeline (model_index.json) in no/such/model"),
    ],
)
def test_bad_recipe_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, key: str
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    assert main(["pretrain", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    assert err.startswith(f"recipe error: 1 problem in {bad}: ") and key in err


def test_bad_override_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pretrain", str(RECIPE), "--set", "train.batch_size=many"]) == 2
    assert "[train.batch_size] expected an integer" in capsys.readouterr().err


def test_shipped_base_model_loads_and_is_small() -> None:
    assert (BASE_MODEL / "model_index.json").exists(), "run: flowrl pretrain recipes/pretrain/world.toml"
    assert _folder_mb(BASE_MODEL) <= 20.0
    backbone = flowrl.build("backbone", {"type": "world_tiny"})
    assert backbone.pixel_space and backbone.latent_shape == (16, 192)
    tokenizer = backbone.pipe.tokenizer_2
    ids = tokenizer(" ".join(vocabulary()))["input_ids"]
    assert tokenizer.unk_token_id not in ids  # every world word is in the vocabulary
    assert sum(p.numel() for p in backbone.transformer.parameters()) < 3_000_000  # fast enough for RL on CPU


def _weights_only(recipe: PretrainRecipe) -> PretrainRecipe:
    """The recipe without the settings that cannot change the trained weights (logging, evaluation, I/O)."""
    train = attrs.evolve(recipe.train, log_every=0, checkpoint_every=0, threads=0, device="cpu", render_workers=1)
    return attrs.evolve(recipe, output_dir="", train=train, eval=EvalConfig())


@pytest.mark.parametrize(
    ("folder", "recipe"),
    [(BASE_MODEL.with_name("base_model_clean"), "world_clean.toml"), (BASE_MODEL, "world.toml")],
    ids=["stage1", "stage2"],
)
def test_shipped_base_model_was_made_by_the_recipe(folder: Path, recipe: str) -> None:
    shipped = load_pretrain_recipe(folder / "pretrain.toml")
    assert _weights_only(shipped) == _weights_only(load_pretrain_recipe(RECIPE.with_name(recipe)))


def test_pool_rendered_by_several_processes_equals_one_pass() -> None:
    scenes = sample_scenes("train", 40, 3)
    assert np.array_equal(render_parallel(scenes, 3, 32, workers=3), render_batch(scenes, 3, 32))
    on_cells = render_parallel(scenes, 3, 32, workers=2, lattice=Lattice(4))
    assert np.array_equal(on_cells, render_batch(scenes, 3, 32, lattice=Lattice(4)))
    assert not np.array_equal(on_cells, render_batch(scenes, 3, 32))


def test_miscaptioned_scenes_recolour_one_group_and_never_draw_a_novel_pair() -> None:
    scenes = sample_scenes("train", 1000, 5)
    assert miscaptioned(scenes, 0.0, 1) == scenes
    assert miscaptioned(scenes, 0.5, 1) == miscaptioned(scenes, 0.5, 1)  # deterministic for a seed
    changed = [(a, b) for a, b in zip(scenes, miscaptioned(scenes, 0.5, 1), strict=True) if a != b]
    assert 0.4 < len(changed) / len(scenes) < 0.6
    for caption, drawn in zip(scenes, miscaptioned(scenes, 1.0, 2), strict=True):
        assert scene_split(drawn) != "novel"  # never a held-out colour-shape pair in the images
        assert drawn.relation == caption.relation and len(drawn.groups) == len(caption.groups)
        diffs = [(g, h) for g, h in zip(caption.groups, drawn.groups, strict=True) if g != h]
        assert len(diffs) == 1
        ((g, h),) = diffs
        assert g.colour != h.colour and (g.shape, g.count) == (h.shape, h.count)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_device_without_cuda_is_a_recipe_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pretrain", str(RECIPE), "--set", "train.device=cuda", "--output-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and "[train.device] 'cuda' but torch sees no CUDA device" in err
    assert not any(tmp_path.iterdir())  # stopped before any work


def test_training_device() -> None:
    assert training_device("cpu").type == "cpu"
    assert training_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="train.device = 'cuda'"):
            training_device("cuda")
