"""``flowrl pretrain``'s entry: the text-to-image base's job (:mod:`~flowrl.pretrain.trainer`) or the edit base's
(:mod:`~flowrl.pretrain.edit`, which builds on the first), as the recipe's ``task`` says."""

from __future__ import annotations

from pathlib import Path

from flowrl.pretrain.edit import EditPretrainer
from flowrl.pretrain.recipe import PretrainRecipe
from flowrl.pretrain.trainer import Pretrainer, PretrainResult


def pretrain(recipe: PretrainRecipe, output_dir: str | Path | None = None, quiet: bool = False) -> PretrainResult:
    """Pre-train as ``recipe`` says and save the pipeline into ``output_dir`` (default: the recipe's); an edit
    recipe (``task = "edit"``) trains the edit base."""
    if recipe.task == "edit":
        return EditPretrainer(recipe, output_dir, quiet).run()
    return Pretrainer(recipe, output_dir, quiet).run()
