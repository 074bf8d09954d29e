"""Loading trained weights back: a run folder, a checkpoint folder or a folder written by ``flowrl export``
becomes a ready policy."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import torch
from torch import Tensor

from flowrl.config.condition_checks import check_reward_conditions
from flowrl.config.recipe import Recipe, load_recipe
from flowrl.core.conditions import check_source
from flowrl.core.interfaces import Backbone, PromptSource
from flowrl.core.types import Schedule
from flowrl.evaluation.evaluate import evaluate, ode_images
from flowrl.rewards.built import BuiltReward
from flowrl.trainer.checkpoints.folder import CheckpointError, find_checkpoint, load_checkpoint, load_weights_into
from flowrl.trainer.checkpoints.manifest import exported_overrides, read_manifest, transformer_weights
from flowrl.trainer.lora import add_lora, own_lora
from flowrl.trainer.rewards import reward_models


@attrs.define
class LoadedPolicy:
    """A backbone with a checkpoint's weights, the recipe's evaluation schedule, prompts and rewards."""

    recipe: Recipe
    backbone: Backbone
    schedule: Schedule
    prompts: PromptSource
    rewards: list[BuiltReward]
    step: int
    source: Path  # the checkpoint folder, the exported folder, or the recipe file for an initial policy
    exported: bool = False  # source is a folder written by flowrl export

    def describe(self) -> str:
        """One line saying which weights these are (the commands print it)."""
        if self.source.suffix == ".toml":
            return f"using the initial policy of {self.source}"
        if self.exported:
            return f"using the exported folder {self.source} (step {self.step})"
        return f"using checkpoint {self.source} (step {self.step})"

    def images(self, prompts: list[str], seed: int = 0) -> Tensor:
        return ode_images(self.backbone, prompts, self.schedule, seed)

    def evaluate(self, limit: int | None = None, seed: int = 0, group: int = 0) -> dict[str, Any]:
        """Figures on the prompt source's evaluation prompts (the first ``limit``), with pass@``group``."""
        prompts = self.prompts.heldout() or self.prompts.sample(limit or 32, torch.Generator().manual_seed(seed))
        prompts = prompts[:limit] if limit else prompts
        result = evaluate(self.backbone, prompts, self.rewards, self.schedule, seed, group)
        return {"step": self.step, **result}


def load_policy(
    path: Path, overrides: Sequence[str] = (), checkpoint: str = "last", check: Callable[[Recipe], None] | None = None
) -> LoadedPolicy:
    """A run folder or checkpoint (its recipe, its weights), a folder written by ``flowrl export`` (its recipe, its
    shipped base if any, its LoRA or transformer), or a recipe file (its initial policy, step 0); ``overrides``
    (``key=value``) change the recipe as ``--set`` does; ``checkpoint`` chooses a run folder's checkpoint:
    ``"last"``, ``"best"`` or a step number.

    Before any weights load, as ``flowrl train`` does: ``check(recipe)`` when given (a command's own check of the
    resolved recipe, such as ``flowrl sample --image`` against what the base takes), then the prompt source is
    built and its condition images held to what the backbone takes, and a reward that reads them to prompts that
    give them (:mod:`flowrl.config.condition_checks`)."""
    manifest = None
    if path.suffix == ".toml":
        recipe = load_recipe(path, overrides)
        folder = path
    else:
        folder = find_checkpoint(path, checkpoint)
        recipe_file = folder / "recipe.toml"
        if not recipe_file.exists():
            raise CheckpointError(f"checkpoint {folder}: missing recipe.toml")
        manifest = read_manifest(folder)
        if manifest is not None:  # the LoRA loads as lora.init; a transformer's tensors as a checkpoint's weights
            recipe = load_recipe(recipe_file, [*exported_overrides(folder, manifest), *overrides])
        else:
            recipe = load_recipe(recipe_file, [*own_lora(folder, recipe_file), *overrides])
    if check is not None:
        check(recipe)
    prompts = recipe.build("prompts")
    check_source(prompts, recipe.parts["backbone"])  # its condition images suit the base, before it loads
    check_reward_conditions(recipe, prompts)  # a reward that reads the source gets prompts with one
    weights, state = None, {"step": 0}
    if manifest is not None:
        state = {"step": manifest.step}
        weights = transformer_weights(folder) if manifest.weights == "transformer" else None
    elif path.suffix != ".toml":
        weights, state, _ = load_checkpoint(folder)
    rewards = reward_models(recipe, int(state["step"]))  # a scheduled weight: its value at the checkpoint's step
    backbone: Backbone = recipe.build("backbone")
    if recipe.lora is not None:
        add_lora(backbone.transformer, recipe.lora)
    if weights is not None:
        if manifest is not None:  # a diffusers model folder also holds the module's buffers
            buffers = {name for name, _ in backbone.transformer.named_buffers()}
            weights = {k: v for k, v in weights.items() if k not in buffers}
        load_weights_into(backbone.transformer, weights, folder)
    backbone.transformer.eval()
    sigmas = backbone.schedule_sigmas(recipe.trainer.eval_steps, recipe.schedule.shift)
    schedule = Schedule(sigmas=sigmas, kernel=recipe.build("kernel"))
    return LoadedPolicy(recipe, backbone, schedule, prompts, rewards, int(state["step"]), Path(folder),
                        exported=manifest is not None)
