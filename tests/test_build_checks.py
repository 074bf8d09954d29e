"""Settings that only the libraries refuse, when the part is built, are refused at recipe load (so by
``flowrl validate``, before any model loads), naming the key; what no check can foresee (LoRA target names
that exist only in the built model) is checked by ``flowrl validate`` on the transformer built without weights,
and is a recipe error when training starts, before any iteration."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import tiny_recipe

from flowrl.backbones.flux.tiny import TinyFlux
from flowrl.backbones.sd3.tiny import TinySD3
from flowrl.config.recipe import RecipeError, recipe_from_dict
from flowrl.trainer import Trainer
from flowrl.trainer.memory import rollout_bytes

Edit = Callable[[dict], object]


def edited(edit: Edit) -> dict:
    data = tiny_recipe(max_steps=1)
    edit(data)
    return data


# (edit, the key the error names, the part class that would refuse the settings when built, or None)
BAD = [
    (lambda d: d["backbone"].update(resolution=15), "backbone.resolution", TinyFlux),
    (lambda d: d["backbone"].update(resolution=18), "backbone.resolution", TinyFlux),
    (lambda d: d["backbone"].update(axes_dims_rope=[4, 4, 4]), "backbone.axes_dims_rope", TinyFlux),
    # the message names both keys: "axes_dims_rope (4, 6, 6) must sum to attention_head_dim 18"
    (lambda d: d["backbone"].update(attention_head_dim=18), "backbone.axes_dims_rope", TinyFlux),
    (lambda d: d.update(backbone={"type": "tiny_sd3", "resolution": 18}), "backbone.resolution", TinySD3),
    (lambda d: d["optim"].update(lr=float("inf")), "optim.lr", None),
    (lambda d: d["loss"].update(clip_range=float("nan")), "loss.clip_range", None),
    (lambda d: d["reward"][0].update(weight=float("-inf")), "reward.weight", None),
    (lambda d: d.update(lora={"target_modules": []}), "lora.target_modules", None),
]


@pytest.mark.parametrize(("edit", "key", "part"), BAD)
def test_refused_at_load_naming_the_key(edit: Edit, key: str, part: type | None) -> None:
    data = edited(edit)
    with pytest.raises(RecipeError) as caught:
        recipe_from_dict(data)
    assert [k for k, _ in caught.value.problems] == [key]
    if part is not None:  # without the check, building the model is where it would have failed
        config = part.Config(**{k: v for k, v in data["backbone"].items() if k != "type"})
        with pytest.raises(ValueError):
            part(config).load_pipeline()


def test_lora_targets_that_the_model_lacks_are_a_recipe_error_before_training(tmp_path: Path) -> None:
    data = edited(lambda d: d.update(lora={"rank": 2, "target_modules": ["no_such_module"]}))
    recipe = recipe_from_dict(data)  # names are only known once the model is built
    with pytest.raises(RecipeError, match=r"\[lora\] cannot attach the adapters: .*no_such_module"):
        Trainer(recipe, tmp_path / "run", quiet=True)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_rollout_batch_that_cannot_fit_is_refused_before_the_first_rollout(tmp_path: Path) -> None:
    data = edited(lambda d: d["sampler"].update(group_size=1_000_000_000))
    with pytest.raises(RecipeError, match=r"\[trainer.prompts_per_step\] 2 prompts x 1000000000 rollouts .* GiB free"):
        Trainer(recipe_from_dict(data), tmp_path / "run", quiet=True)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    assert rollout_bytes(2, 4, (16, 12), 256) == 4 * 2 * (5 * 192 + 3 * 256)  # the bound's arithmetic


def test_a_tree_whose_first_plan_cannot_fit_is_refused_before_its_first_rollout(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A tree's rollouts per prompt depend on the plan (factor ** units): the build-time check can only count the
    smallest plan's (one split: 2 a prompt); the first iteration's plan (3 splits: 8 a prompt) is checked before
    it rolls out. Free memory between the two bounds passes the first check and fails the second."""
    import flowrl.trainer.memory as memory

    data = edited(lambda d: d.update(sampler={"type": "branch_tree", "factor": 2},
                                     advantage={"type": "branch_depthwise"}))
    recipe = recipe_from_dict(data)
    per, steps = recipe.trainer.prompts_per_step, recipe.schedule.num_steps
    shape, pixels = recipe.build("backbone").latent_shape, 16 * 16
    smallest, planned = rollout_bytes(per * 2, steps, shape, pixels), rollout_bytes(per * 8, steps, shape, pixels)
    monkeypatch.setattr(memory, "available_bytes", lambda device: (smallest + planned) // 2)
    trainer = Trainer(recipe, tmp_path / "run", quiet=True)
    try:
        refusal = rf"\[trainer.prompts_per_step\] {per} prompts x 8 rollouts \('branch_tree'"
        with pytest.raises(RecipeError, match=refusal):
            trainer.iteration()
    finally:
        trainer.release()
    assert trainer.step == 0 and trainer.backbone.nfe == 0  # refused before the rollout's first forward


@pytest.mark.parametrize("backbone", [None, {"type": "tiny_sd3", "resolution": 16}])
def test_validate_checks_lora_targets_against_the_model_without_weights(  # type: ignore[no-untyped-def]
    tmp_path: Path, capsys, backbone: dict | None
) -> None:
    """flowrl validate builds the transformer on the meta device (no weights) and names each target that
    selects no layer, including a typo beside a valid target (peft would ignore it silently)."""
    from flowrl.cli.main import main

    data = edited(lambda d: d.update(lora={"rank": 2, "target_modules": ["to_q", "to_kk"]}))
    if backbone is not None:
        data["backbone"] = backbone
    path = tmp_path / "r.toml"
    path.write_text(recipe_from_dict(data).to_toml())
    assert main(["validate", str(path)]) == 2
    out = capsys.readouterr().out
    assert "[lora.target_modules] 'to_kk' matches no adaptable layer" in out and "'to_q'" not in out
    data["lora"]["target_modules"] = ["to_q", "to_out.0"]
    path.write_text(recipe_from_dict(data).to_toml())
    assert main(["validate", str(path)]) == 0
