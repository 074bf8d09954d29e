"""``flowrl pretrain`` of the world's edit base (``task = "edit"``): triples of the train and test edit splits, the
instruction words in the tokenizer, the text-to-image base's weights carried over, and the shipped edit base."""

from __future__ import annotations

import math
from pathlib import Path

import attrs
import pytest
import torch
from conftest import ROOT

import flowrl
from flowrl.core.conditions import conditions_of
from flowrl.pretrain import PretrainRecipe, load_pretrain_recipe
from flowrl.pretrain.edit import EditPretrainer, pretrain_edits
from flowrl.pretrain.model import build_backbone, load_initial_weights
from flowrl.pretrain.recipe import EvalConfig
from flowrl.world.components import BASE_MODEL
from flowrl.world.edit import EDIT_KINDS, edit_split, edit_vocabulary
from flowrl.world.edit_base import EDIT_MODEL

RECIPE = ROOT / "recipes" / "pretrain" / "world_edit.toml"
SHORT = [
    "train.steps=3",
    "train.batch_size=8",
    "train.pool_size=16",
    "train.warmup_steps=0",
    "train.ema_decay=0.0",
    "train.log_every=0",
    "eval.every=0",
    "eval.prompts=5",
    "eval.num_steps=2",
]


def test_the_data_are_train_and_test_edits_never_novel() -> None:
    edits = pretrain_edits(400, 0)
    splits = [edit_split(e) for e in edits]
    assert set(splits) == {"train", "test"} and splits[:4] == ["train", "test", "train", "test"]
    assert {e.kind for e in edits} == set(EDIT_KINDS)
    assert pretrain_edits(400, 0) == edits and pretrain_edits(400, 1) != edits


def test_the_text_to_image_base_is_carried_over_word_by_word() -> None:
    recipe = load_pretrain_recipe(RECIPE)
    backbone = build_backbone(recipe.model, 0, "edit")
    load_initial_weights(backbone, str(BASE_MODEL))
    base = flowrl.build("backbone", {"type": "world_tiny"})
    old, new = base.pipe.tokenizer_2.get_vocab(), backbone.pipe.tokenizer_2.get_vocab()
    assert set(old) < set(new) and {"make", "move", "remove", "add", "the", "it"} <= set(new) - set(old)
    for name in ("transformer",):
        saved, loaded = getattr(base.pipe, name).state_dict(), getattr(backbone.pipe, name).state_dict()
        assert all(torch.equal(saved[k], loaded[k]) for k in saved)
    t5_old, t5_new = base.pipe.text_encoder_2.shared.weight, backbone.pipe.text_encoder_2.shared.weight
    clip_old, clip_new = (_token_embedding(m.pipe.text_encoder) for m in (base, backbone))
    for word in ("red", "circle", "left", "<pad>", "</s>"):
        assert torch.equal(t5_new[new[word]], t5_old[old[word]])
        assert torch.equal(clip_new[new[word]], clip_old[old[word]])
    fresh = build_backbone(recipe.model, 0, "edit").pipe.text_encoder_2.shared.weight
    assert torch.equal(t5_new[new["make"]], fresh[new["make"]])  # a new word keeps its fresh row
    prompt = ["two red circles"]
    base_codes = base.pipe.encode_prompt(prompt, None, max_sequence_length=16)[0]
    edit_codes = backbone.pipe.encode_prompt(prompt, None, max_sequence_length=16)[0]
    assert torch.allclose(base_codes, edit_codes, atol=1e-6)  # the same text, the same encoding


def _token_embedding(module: torch.nn.Module) -> torch.Tensor:
    return next(v for k, v in module.state_dict().items() if k.endswith("token_embedding.weight"))


def test_an_edit_pretraining_saves_a_loadable_edit_base(tmp_path: Path) -> None:
    recipe = load_pretrain_recipe(RECIPE, SHORT)
    trainer = EditPretrainer(recipe, tmp_path / "model", quiet=True)
    images, prompts = trainer.batch(0)
    assert images.shape == (8, 3, 32, 32) and all(len(conditions_of(p)) == 1 for p in prompts)
    result = trainer.run()
    assert len(result.losses) == 3 and all(math.isfinite(v) for v in result.losses)
    (figures,) = result.evals
    assert {"test/strict", "test/strict_se", "test/follow", "novel/strict"} <= set(figures)
    assert 0.0 <= figures["test/score"] <= 1.0
    backbone = flowrl.build("backbone", {"type": "world_edit_tiny", "path": str(tmp_path / "model")})
    tokenizer = backbone.pipe.tokenizer_2
    assert tokenizer.unk_token_id not in tokenizer(" ".join(edit_vocabulary()))["input_ids"]
    assert (tmp_path / "model" / "pretrain.toml").exists() and (tmp_path / "model" / "pretrain.json").exists()


def test_a_text_to_image_recipe_does_not_name_a_task() -> None:
    assert load_pretrain_recipe(ROOT / "recipes" / "pretrain" / "world.toml").task == "text_to_image"
    assert load_pretrain_recipe(RECIPE).task == "edit"
    with pytest.raises(Exception, match="task"):
        load_pretrain_recipe(RECIPE, ["task=edits"])


def _weights_only(recipe: PretrainRecipe) -> PretrainRecipe:
    train = attrs.evolve(recipe.train, log_every=0, checkpoint_every=0, threads=0, device="cpu", render_workers=1)
    return attrs.evolve(recipe, output_dir="", train=train, eval=EvalConfig())


def test_the_shipped_edit_base_loads_without_a_path_and_was_made_by_the_recipe() -> None:
    assert (EDIT_MODEL / "model_index.json").exists(), "run: flowrl pretrain recipes/pretrain/world_edit.toml"
    size_mb = sum(f.stat().st_size for f in EDIT_MODEL.rglob("*") if f.is_file()) / 2**20
    assert size_mb <= 20.0
    backbone = flowrl.build("backbone", {"type": "world_edit_tiny"})
    assert backbone.pixel_space and backbone.latent_shape == (16, 192)
    tokenizer = backbone.pipe.tokenizer_2
    assert tokenizer.unk_token_id not in tokenizer(" ".join(edit_vocabulary()))["input_ids"]
    shipped = load_pretrain_recipe(EDIT_MODEL / "pretrain.toml")
    assert _weights_only(shipped) == _weights_only(load_pretrain_recipe(RECIPE))
