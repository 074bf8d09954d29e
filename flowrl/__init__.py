"""flowrl: reinforcement-learning fine-tuning of flow-matching text-to-image models, as composable parts.

Public API: :func:`build`, :func:`available`, :func:`load_recipe`, :func:`register`, the interfaces and
the batch types.
"""

from flowrl import quiet
from flowrl.errors import UserError
from flowrl.extras import Extra, PerRollout, RolloutIds
from flowrl.interfaces import (
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
from flowrl.recipe import Recipe, RecipeError, load_recipe
from flowrl.registry import KINDS, available, build, register, registry
from flowrl.suites import interface as _suite_interface  # noqa: F401  (gives the 'suite' kind its interface)
from flowrl.types import (
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

quiet.install()  # transformers' torchvision fallback warning: nothing a flowrl user can act on (flowrl.quiet)

__version__ = "0.1.0"

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
