"""A run's checkpoints: the periodic ``checkpoints/step_N`` folders, ``checkpoints/best``, and resuming.

A step checkpoint holds the trained weights (full tensors, also when sharded), the LoRA export, the optimizer,
LR schedule and EMA state (one slice per process when sharded), the RNG states, every part's
state (``state_dict``), the loop's counters, the recipe and a row of sample images. ``best`` holds the weights,
the LoRA export and the recipe only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flowrl.backbones.lora.export import LORA_FOLDER, export_lora
from flowrl.config.recipe import Recipe
from flowrl.core.interfaces import Component
from flowrl.trainer.checkpoints.folder import (
    BEST,
    CheckpointError,
    begin_checkpoint,
    load_checkpoint,
    load_shard,
    rng_state,
    save_checkpoint,
    save_shard,
    set_rng_state,
)
from flowrl.trainer.heldout import Grid
from flowrl.trainer.logger import write_grid
from flowrl.trainer.policy import TrainedPolicy
from flowrl.trainer.run_errors import BestMetricError, NonFiniteError
from flowrl.trainer.runfolder import RunFolder
from flowrl.trainer.sharding import merge_slices


def best_figure(figures: dict[str, Any], setting: str, key: str | None = None) -> tuple[str, float]:
    """The key and value of ``trainer.keep_best``'s figure (``setting``, or ``key`` when given) in ``figures``;
    ``("", -inf)`` when off. "auto": ``eval/strict`` where the evaluation reports it, else ``eval/score``."""
    key = setting if key is None else key
    if key == "auto":
        key = next((k for k in ("eval/strict", "eval/score") if k in figures), "")
    if not key:
        return "", -math.inf
    if key not in figures:
        found = ", ".join(sorted(k for k in figures if k.startswith("eval/"))) or "none"
        raise BestMetricError(f"trainer.keep_best = {key!r} is not an evaluation figure of this run ({found})")
    value = float(figures[key])
    return key, value if math.isfinite(value) else -math.inf


class RunCheckpoints:
    """Writes and reads one run's checkpoints. ``counters`` are the loop's (step, nfe, wall_s, skipped,
    best_value); ``grid`` computes the sample row a step checkpoint keeps (None: none)."""

    def __init__(
        self,
        folder: RunFolder,
        recipe: Recipe,
        policy: TrainedPolicy,
        components: dict[str, Component],
        grid: Callable[[int], Grid | None],
    ) -> None:
        self.folder, self.run_dir = folder, folder.path
        self.recipe, self.policy, self.accelerator = recipe, policy, policy.accelerator
        self.components, self.grid = components, grid
        self.saved_step: int | None = None  # the step of the checkpoint written (or resumed from) last

    def save(self, counters: dict[str, Any]) -> Path | None:
        """Write ``checkpoints/step_N`` (the main process; every process takes part when sharded: the weights
        and LoRA are gathered, and each process writes its slice of the optimizer and EMA state). A step that
        already has its checkpoint (the last step a multiple of ``checkpoint_every``, a stop signal after a
        periodic checkpoint, ``--resume`` of a finished run) is not written again: nothing has changed since."""
        accelerator, policy, step = self.accelerator, self.policy, counters["step"]
        folder = self.run_dir / "checkpoints" / f"step_{step:06d}"
        if step == self.saved_step:
            return folder if accelerator.is_main_process else None
        accelerator.wait_for_everyone()
        weights, lora = policy.weights(), policy.lora_layers()
        bad = policy.non_finite(weights)
        if bad:  # never write a checkpoint a NaN has reached
            raise NonFiniteError(f"weights became non-finite ({bad}); no checkpoint written at step {step}")
        policy_state = policy.state()
        if policy.sharded:
            if accelerator.is_main_process:
                begin_checkpoint(folder)
            accelerator.wait_for_everyone()
            save_shard(folder, accelerator.process_index, {k: policy_state.pop(k) for k in ("optimizer", "ema")})
            accelerator.wait_for_everyone()
        with policy.inference():
            grid = self.grid(step)
        self.saved_step = step  # on every process, so that all skip the same steps (a main-only write may fail)
        if not accelerator.is_main_process:
            return None
        best = counters["best_value"]
        state = {**counters, "best_value": best if math.isfinite(best) else None}
        if policy.sharded:
            state["sharded_processes"] = accelerator.num_processes
            state["shard_group"] = policy.shard_group  # one copy's processes: all of them, or a node's (hybrid)
        extra = {
            **policy_state,
            "rng": rng_state({}),
            "components": {name: part.state_dict() for name, part in self.components.items()},
        }

        def also(staged: Path) -> None:  # inside the staging folder: renamed into place with the rest
            if lora is not None:  # also in the diffusers format: pipe.load_lora_weights(path / "lora")
                export_lora(policy.backbone, staged / LORA_FOLDER, layers=lora)
            (staged / "recipe.toml").write_text(self.recipe.to_toml())
            if grid is not None:
                write_grid(grid, staged / "samples.png")

        keep = self.recipe.trainer.keep_checkpoints
        return save_checkpoint(folder, weights, state, extra, keep, staged=policy.sharded, also=also)

    def save_best(self, counters: dict[str, Any], figure: str, value: float) -> None:
        """Write ``checkpoints/best``: the weights, the counters and the figure that made them the best."""
        weights, lora = self.policy.weights(), self.policy.lora_layers()  # every process: gathering is collective
        if not self.accelerator.is_main_process:
            return
        folder = self.run_dir / "checkpoints" / BEST
        state = {k: counters[k] for k in ("step", "nfe", "wall_s")} | {"best": {"figure": figure, "value": value}}
        recipe = self.recipe.to_toml()

        def also(staged: Path) -> None:  # in the staging folder, renamed into place with the weights
            (staged / "recipe.toml").write_text(recipe)
            if lora is not None:  # as every step checkpoint: the diffusers folder and the kohya file
                export_lora(self.policy.backbone, staged / LORA_FOLDER, layers=lora)

        save_checkpoint(folder, weights, state, {}, keep=None, also=also)

    def resume(self, folder: Path) -> dict[str, Any]:
        """Restore the policy, RNG and component state from a step checkpoint; returns its counters."""
        weights, state, extra = load_checkpoint(folder)
        if "lr_schedule" not in extra:
            if Path(folder).name.startswith("step_"):
                raise CheckpointError(f"checkpoint {folder}: extra.pt is missing (the optimizer, RNG and part states"
                                      "); resume from another step_* folder")
            raise CheckpointError(f"checkpoint {folder} holds weights only (a best checkpoint); resume from a step_*")
        self.folder.check_history(Path(folder), int(state["step"]), self.recipe.trainer.log_every)
        # A sharded run's optimizer and EMA state is one slice per process; another process count (or no
        # sharding) resumes from the slices merged into full tensors.
        written = int(state.get("sharded_processes", 0))
        group = int(state.get("shard_group", written))  # with hybrid sharding ranks 0..group-1 hold one copy
        sliced = (written > 0 and self.policy.sharded and written == self.accelerator.num_processes
                  and group == self.policy.shard_group)
        if sliced:
            extra.update(load_shard(folder, self.accelerator.process_index, written))
        elif written:
            extra.update(merge_slices([load_shard(folder, rank, written) for rank in range(group)]))
        self.policy.load(weights, extra, folder, self.recipe.optim, sliced)
        if Path(folder).resolve().parent == (self.run_dir / "checkpoints").resolve():  # this run's own
            self.saved_step = int(state["step"])
        set_rng_state(extra["rng"], {})
        for name, part in self.components.items():
            if name in extra["components"]:  # checkpoints before every part's state was saved lack some
                part.load_state_dict(extra["components"][name])
        best = state.get("best_value")
        return {
            "step": state["step"],
            "nfe": state["nfe"],
            "rows": int(state.get("rows", 0)),  # checkpoints before the rows counter lack it
            "wall_s": state["wall_s"],
            "skipped": state.get("skipped", 0),
            "best_value": -math.inf if best is None else float(best),
        }
