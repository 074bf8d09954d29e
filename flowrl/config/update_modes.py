"""How the policy update gets the velocities it differentiates (``[trainer] update``; docs/performance.md).

- ``recompute``: the update runs the transformer again, with gradients, on every trained input (the rollout
  ran it without). Always exact; holds one micro-batch's activations at a time.
- ``retain``: the rollout's own forward at each trained input keeps its autograd graph, and the update
  backpropagates through it once the advantages are known: no second forward. With one optimizer step per
  iteration the weights that made the rollout are the weights being updated, so the gradient is the
  recompute path's. It holds the activations of every trained input from the rollout to the update.
- ``auto`` (default): ``retain`` where it is exact for the recipe, else ``recompute``.

``retain`` is exact only when the update would see the same function as the rollout: one inner epoch (a
second epoch differentiates moved weights), a loss on the rollout's own transitions (a forward-process loss
trains at re-noised points the rollout never visited), no sharding (FSDP gathers the weights only for the
rollout) and no dropout (the update runs in training mode). Samplers mark forwards that are never trained
inputs, such as the deterministic tails after an exploration step (:mod:`flowrl.parts.samplers.untrained`), so that
no graph is kept for them; unmarked ones cost memory, never correctness.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

from flowrl.core.choices import values
from flowrl.core.interfaces import ForwardProcessLoss

UpdateMode = Literal["auto", "recompute", "retain"]
UPDATE_MODES = values(UpdateMode)


def retain_conflicts(recipe: Any) -> list[tuple[str, str]]:
    """The settings of ``recipe`` under which ``retain`` would not give the recompute path's gradient, as
    (key, why) pairs; empty when it is exact."""
    t = recipe.trainer
    conflicts = []
    if t.inner_epochs > 1:
        conflicts.append(("trainer.inner_epochs", f"{t.inner_epochs} inner epochs differentiate moved weights"))
    if issubclass(recipe.parts["loss"].cls, ForwardProcessLoss):
        conflicts.append(("loss", f"{recipe.parts['loss'].type} trains at re-noised points no rollout visited"))
    if t.sharding != "none":
        conflicts.append(("trainer.sharding", "sharded weights are gathered only for the rollout"))
    if recipe.lora is not None and recipe.lora.dropout > 0:
        conflicts.append(("lora.dropout", "dropout makes the update's forward differ from the rollout's"))
    return conflicts


def resolve_update(recipe: Any) -> str:
    """``recompute`` or ``retain``: what ``trainer.update`` means for ``recipe`` (``auto``: retain if exact)."""
    mode = recipe.trainer.update
    if mode == "auto":
        return "recompute" if retain_conflicts(recipe) else "retain"
    return str(mode)


def update_checks(recipe: Any) -> Iterator[tuple[str, str]]:
    """Recipe errors: ``retain`` asked for where it is not exact."""
    if recipe.trainer.update != "retain":
        return
    for key, why in retain_conflicts(recipe):
        yield ("trainer.update", f"'retain' is not exact with {key}: {why}; use 'recompute' or 'auto'")
