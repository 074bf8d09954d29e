"""``trainer.loggers``: TensorBoard by default; an unknown name is a recipe error, a tracker whose extra is not
installed stops the run in one line naming the extra; the hosted run id is made once per run folder."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from conftest import tiny_recipe

from flowrl.config.recipe import RecipeError, recipe_from_dict
from flowrl.trainer.logger import RunLogger
from flowrl.trainer.trackers import TrackerError, missing_extra, run_id


def test_the_default_is_tensorboard_and_it_gets_the_recipe(tmp_path: Path) -> None:
    recipe = recipe_from_dict(tiny_recipe())
    assert recipe.trainer.loggers == ("tensorboard",)
    logger = RunLogger(tmp_path, recipe=recipe)
    logger.log({"step": 1, "loss": 0.5, "note": "text is not a scalar"})
    logger.close()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"tensors": 0})
    events.Reload()
    assert [e.value for e in events.Scalars("loss")] == [0.5]
    assert "recipe/text_summary" in events.Tags()["tensors"]


@pytest.mark.parametrize(("loggers", "why"), [(["mlflow"], "unknown logger 'mlflow'"),
                                               (["wandb", "wandb"], "appears twice")])
def test_bad_logger_names_are_recipe_errors(loggers: list[str], why: str) -> None:
    with pytest.raises(RecipeError, match=why) as error:
        recipe_from_dict(tiny_recipe(loggers=loggers))
    assert "trainer.loggers" in str(error.value)


@pytest.mark.parametrize("name", ["wandb", "swanlab"])
def test_a_missing_extra_is_named(name: str, tmp_path: Path) -> None:
    if importlib.util.find_spec(name) is not None:
        pytest.skip(f"{name} is installed here")
    assert missing_extra(name) is not None
    needs = rf"needs the {name} package, which is not installed: pip install {name} \(or, in a flowrl checkout"
    with pytest.raises(TrackerError, match=needs):
        RunLogger(tmp_path, recipe=recipe_from_dict(tiny_recipe(loggers=["tensorboard", name])))
    assert not (tmp_path / "tb").exists()  # checked before any tracker starts


@pytest.mark.parametrize("name", ["wandb", "swanlab"])
def test_validate_and_train_name_a_missing_tracker_before_any_model_loads(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, a missing wandb was found only once the model had loaded, and validate passed the recipe."""
    if importlib.util.find_spec(name) is not None:
        pytest.skip(f"{name} is installed here")
    from flowrl.cli.main import main
    from flowrl.config.tomlwrite import dumps
    from flowrl.trainer import loop

    recipe = tmp_path / "r.toml"
    recipe.write_text(dumps(tiny_recipe(loggers=["tensorboard", name])))
    assert main(["validate", str(recipe)]) == 2

    def no_parts(*args: object) -> None:  # the trainer builds its parts and model only after the check
        raise AssertionError("a part was built before the missing tracker was found")

    monkeypatch.setattr(loop.Recipe, "build", no_parts)
    assert main(["train", str(recipe), "--output-dir", str(tmp_path / "run")]) == 2


def test_the_run_id_is_made_once_per_run_folder(tmp_path: Path) -> None:
    first = run_id(tmp_path / "a", "wandb") if (tmp_path / "a").mkdir() is None else ""
    assert run_id(tmp_path / "a", "wandb") == first
    (tmp_path / "b").mkdir()
    assert run_id(tmp_path / "b", "wandb") != first
