"""What a resumed run may change (the run folder records it: :meth:`flowrl.trainer.runfolder.RunFolder.write_recipe`).

A resumed run continues the same optimizer state, random streams and sampled prompts, so it must keep its
method, model, rewards and seed: a change there would make the folder describe one run while another ran.
Only the ``[trainer]`` and ``[optim]`` tables (how long, how often, the learning rate, ...) and the name may
change on resume. The run folder then keeps the settings that ran before the resume in
``recipe.step_<N>.toml`` (N: the step resumed from) and the new ones in ``recipe.toml``.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flowrl.backbones.lora.export import LORA_FOLDER
from flowrl.config.recipe import Recipe, RecipeError, recipe_from_dict
from flowrl.trainer.lora import own_lora
from flowrl.trainer.state_io import CheckpointError
from flowrl.trainer.state_io import apply_optim_settings as apply_optim_settings  # its import path before state_io

RESUMABLE = ("name", "trainer.", "optim.")  # keys (or key prefixes) a resume may change


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists stay values (a ``[[reward]]`` list compares whole)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def recipe_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(key, value before, value after)`` for every resolved key that differs (``None``: absent)."""
    a, b = flatten(before), flatten(after)
    return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def saved_settings(recipe_file: Path) -> dict[str, Any]:
    """The resolved settings of a saved ``recipe.toml`` (a recipe written before the ``[schedule]`` table is
    read as the current format)."""
    return recipe_from_dict(tomllib.loads(recipe_file.read_text(encoding="utf-8")), source=str(recipe_file)).to_dict()


def check_resume(checkpoint: Path, recipe: Recipe) -> list[tuple[str, Any, Any]]:
    """The changes ``recipe`` makes to the recipe that wrote ``checkpoint``: a :class:`RecipeError` naming
    each key outside :data:`RESUMABLE`, else the list (empty when nothing changed)."""
    saved = Path(checkpoint) / "recipe.toml"
    if not saved.is_file():
        raise CheckpointError(f"checkpoint {checkpoint}: recipe.toml is missing (a resumed run is checked against"
                              " it); use another checkpoint (an earlier step_* folder)")
    try:
        settings = saved_settings(saved)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"checkpoint {checkpoint}: recipe.toml is truncated or corrupt ({error}); use another"
                              " checkpoint (an earlier step_* folder)") from None
    if own_lora(Path(checkpoint), saved):  # the run opens with the checkpoint's own LoRA export (moved runs)
        settings["lora"]["init"] = str(Path(checkpoint) / LORA_FOLDER)
    changes = recipe_changes(settings, recipe.to_dict())
    refused = [(k, old, new) for k, old, new in changes if not k.startswith(RESUMABLE)]
    if refused:
        raise RecipeError(
            recipe.source,
            [
                (key, f"is {new!r} but the run being resumed used {old!r} ({saved}); a resumed run keeps its method,"
                 " model, rewards and seed: resume with the run's recipe.toml, or start a new run")
                for key, old, new in refused
            ],
        )
    return changes
