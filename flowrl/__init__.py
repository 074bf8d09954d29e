"""flowrl: reinforcement-learning fine-tuning of flow-matching text-to-image models, as composable parts.

Public API: :func:`build`, :func:`available`, :func:`load_recipe`, :func:`register`, the interfaces and
the batch types. The packages: :mod:`flowrl.core` (the contracts), :mod:`flowrl.config` (recipes),
:mod:`flowrl.parts` (the built-in parts), :mod:`flowrl.trainer`, :mod:`flowrl.evaluation`, the feature packages
(backbones, rewards, world, suites, bench, report, export, serve, pretrain, conformance), :mod:`flowrl.cli` and
:mod:`flowrl.utils`; the module paths from before this grouping (``flowrl.selectors``, ``flowrl.recipe``, ...)
still import (:mod:`flowrl._moved`).
"""

from flowrl import _moved  # (first: its finder answers the old module paths; a plugin may name one)
from flowrl.config.recipe import Recipe, RecipeError, load_recipe
from flowrl.core.errors import UserError
from flowrl.core.extras import Extra, PerRollout, RolloutIds
from flowrl.core.interfaces import (
    AdvantageEstimator,
    Backbone,
    Component,
    ForwardProcessLoss,
    Loss,
    PolicyLoss,
    PromptSource,
    RewardModel,
    RolloutSampler,
    TimestepSelector,
    TransitionKernel,
)
from flowrl.core.registry import KINDS, available, build, register, registry
from flowrl.core.types import (
    Advantages,
    Conditioning,
    LossInputs,
    Plan,
    PlanError,
    RewardBatch,
    Rollout,
    Schedule,
    StepOutput,
    Transitions,
    Unit,
)
from flowrl.core.version import __version__ as __version__
from flowrl.suites import interface as _suite_interface  # noqa: F401  (gives the 'suite' kind its interface)
from flowrl.utils import quiet

_moved.keep_exports(globals())  # `import flowrl.registry` must leave the function flowrl.registry as it is
quiet.install()  # transformers' torchvision fallback warning: nothing a flowrl user can act on (flowrl.utils.quiet)



def __getattr__(name: str) -> object:
    """``from flowrl import selectors`` and the other modules' names from before the grouping."""
    return _moved.attribute(name)

__all__ = [
    "KINDS",
    "AdvantageEstimator",
    "Advantages",
    "Backbone",
    "Component",
    "Conditioning",
    "Extra",
    "ForwardProcessLoss",
    "Loss",
    "LossInputs",
    "PerRollout",
    "Plan",
    "PlanError",
    "PolicyLoss",
    "PromptSource",
    "Recipe",
    "RecipeError",
    "RewardBatch",
    "RewardModel",
    "Rollout",
    "RolloutIds",
    "RolloutSampler",
    "Schedule",
    "StepOutput",
    "TimestepSelector",
    "TransitionKernel",
    "Transitions",
    "Unit",
    "UserError",
    "available",
    "build",
    "load_recipe",
    "register",
    "registry",
]
