"""Pre-training the embedded world's base model by flow matching (``flowrl pretrain``).

:mod:`~flowrl.pretrain.recipe` reads and validates a pre-training recipe, :mod:`~flowrl.pretrain.model`
builds the pixel-space tiny FLUX, :mod:`~flowrl.pretrain.data` renders its images and
:mod:`~flowrl.pretrain.trainer` runs the job. This package sits beside :mod:`flowrl.world` and uses only
its public functions; the RL trainer never imports it.
"""

from flowrl.pretrain.recipe import PretrainRecipe, PretrainRecipeError, load_pretrain_recipe
from flowrl.pretrain.trainer import Pretrainer, PretrainResult, pretrain

__all__ = [
    "PretrainRecipe",
    "PretrainRecipeError",
    "PretrainResult",
    "Pretrainer",
    "load_pretrain_recipe",
    "pretrain",
]
