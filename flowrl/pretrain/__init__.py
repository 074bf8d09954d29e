"""Pre-training the embedded world's base model by flow matching (``flowrl pretrain``).

:mod:`~flowrl.pretrain.recipe` reads and validates a pre-training recipe, :mod:`~flowrl.pretrain.model`
builds the pixel-space tiny FLUX, :mod:`~flowrl.pretrain.data` renders its images and
:mod:`~flowrl.pretrain.trainer` runs the job. This package sits beside :mod:`flowrl.world` and uses only
its public functions; the RL trainer never imports it.
"""

from typing import Any

_EXPORTS = {
    "PretrainRecipe": "recipe",
    "PretrainRecipeError": "recipe",
    "load_pretrain_recipe": "recipe",
    "Pretrainer": "trainer",
    "PretrainResult": "trainer",
    "pretrain": "run",
}


def __getattr__(name: str) -> Any:
    """Import the submodules on first use: ``flowrl --help`` and the CLI's parser stay free of torch/diffusers."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'flowrl.pretrain' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"flowrl.pretrain.{_EXPORTS[name]}"), name)


__all__ = [
    "PretrainRecipe",
    "PretrainRecipeError",
    "PretrainResult",
    "Pretrainer",
    "load_pretrain_recipe",
    "pretrain",
]
