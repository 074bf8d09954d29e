"""Checkpoints: trainable weights (safetensors), optimizer, LR schedule, EMA, RNG and component state.

A checkpoint is written to a temporary folder and renamed into place, so a crash never leaves half of
one; the newest ``keep`` are kept.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from flowrl.trainer.state_io import CheckpointError
from flowrl.trainer.state_io import load_weights_into as load_weights_into  # its import path before state_io
from flowrl.trainer.writes import refused_writes

WEIGHTS = "weights.safetensors"
STATE = "trainer_state.json"


def rng_state(generators: dict[str, torch.Generator]) -> dict[str, Any]:
    return {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
        "generators": {k: g.get_state() for k, g in generators.items()},
    }


def set_rng_state(state: dict[str, Any], generators: dict[str, torch.Generator]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    for key, generator in generators.items():
        generator.set_state(state["generators"][key])


BEST = "best"  # checkpoints/best: the weights with the best evaluation figure (trainer.keep_best)


def save_checkpoint(
    folder: Path,
    weights: dict[str, Tensor],
    state: dict[str, Any],
    extra: dict[str, Any],
    keep: int | None,
    staged: bool = False,
    also: Callable[[Path], None] | None = None,
) -> Path:
    """Write ``folder`` atomically: weights, JSON state and a torch file of everything else, plus whatever
    ``also(staging_folder)`` writes (the recipe, a LoRA export, sample images), all before the rename, so a
    kill at any moment leaves either the complete folder or none; then keep the newest ``keep`` step folders
    beside it (None: prune nothing). ``staged``: :func:`begin_checkpoint` was called and every process has
    written its shard (:func:`save_shard`) into the staging folder."""
    folder = Path(folder)
    then = "free space and continue with --resume (the earlier checkpoints are complete)"
    with refused_writes(folder, then):
        tmp = staging(folder) if staged else begin_checkpoint(folder)
        try:
            save_file({k: v.detach().contiguous().cpu() for k, v in weights.items()}, str(tmp / WEIGHTS))
            torch.save(extra, tmp / "extra.pt")
            (tmp / STATE).write_text(json.dumps(state, indent=2))
            if also is not None:
                also(tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)  # a half-written staging folder only takes space
            raise
        replace(folder, tmp)
    if keep is not None:
        prune(folder.parent, keep)
    return folder


def replace(folder: Path, tmp: Path) -> None:
    """Rename the complete ``tmp`` into ``folder``'s place so that a complete copy exists at every moment: an
    older ``folder`` is first renamed aside (:func:`retired`) and deleted only once the new one is in place; a
    kill between the two renames leaves the older copy, which :func:`recover` renames back."""
    if not folder.exists():
        tmp.rename(folder)
        return
    old = retired(folder)
    if old.exists():
        shutil.rmtree(old)
    folder.rename(old)
    tmp.rename(folder)
    shutil.rmtree(old)


def retired(folder: Path) -> Path:
    """Where a checkpoint folder waits while its replacement is renamed into place."""
    return folder.with_name(folder.name + ".old")


def recover(parent: Path) -> None:
    """Rename back each checkpoint a kill left aside while replacing it (:func:`replace`) and drop those whose
    replacement is complete; a folder that cannot be written is left as it is (read-only runs are read)."""
    for old in parent.glob("*.old") if parent.is_dir() else ():
        folder = old.with_name(old.name[: -len(".old")])
        try:
            if (folder / STATE).exists():
                shutil.rmtree(old)
            elif (old / STATE).exists():
                if folder.exists():
                    shutil.rmtree(folder)
                old.rename(folder)
        except OSError:
            pass


def staging(folder: Path) -> Path:
    """Where ``folder`` is written before it is renamed into place."""
    return folder.with_name(folder.name + ".tmp")


def begin_checkpoint(folder: Path) -> Path:
    """A fresh, empty staging folder for ``folder`` (the main process; the others wait for it)."""
    tmp = staging(Path(folder))
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


def shard_file(folder: Path, rank: int) -> Path:
    """Process ``rank``'s slice of the optimizer and EMA state in a sharded run's checkpoint."""
    return Path(folder) / f"shard_{rank:03d}.pt"


def save_shard(folder: Path, rank: int, state: dict[str, Any]) -> None:
    """Write this process's state slice into ``folder``'s staging folder (after :func:`begin_checkpoint`)."""
    torch.save(state, shard_file(staging(Path(folder)), rank))


def load_shard(folder: Path, rank: int, processes: int) -> dict[str, Any]:
    """Process ``rank``'s state slice of a checkpoint written by ``processes`` sharded processes."""
    path = shard_file(folder, rank)
    if not path.exists():
        raise CheckpointError(f"checkpoint {folder}: missing {path.name} (written by {processes} sharded processes)")
    try:
        return dict(torch.load(path, weights_only=False))
    except Exception as error:
        raise CheckpointError(f"checkpoint {folder}: {path.name} is truncated or corrupt ({error})") from None


def prune(parent: Path, keep: int) -> None:
    for old in list_checkpoints(parent)[:-keep]:
        shutil.rmtree(old)


def list_checkpoints(parent: Path) -> list[Path]:
    """Complete checkpoints under ``parent``, oldest first."""
    if not parent.is_dir():
        return []
    found = [p for p in step_folders(parent) if (p / STATE).exists()]
    return sorted(found, key=checkpoint_step)


def step_folders(parent: Path) -> list[Path]:
    """The ``step_NNNNNN`` folders under ``parent``, complete or not (staging folders and other names left out)."""
    return [p for p in parent.glob("step_*") if p.is_dir() and p.name[len("step_"):].isdigit()]


def checkpoint_step(folder: Path) -> int:
    """The step of a ``step_NNNNNN`` checkpoint folder."""
    return int(folder.name.split("_")[1])


def find_checkpoint(path: Path, which: str = "last", exported: bool = True) -> Path:
    """A checkpoint folder as given, or one of a run folder: ``which`` is ``"last"`` (the newest),
    ``"best"`` (``checkpoints/best``) or a step number. A folder written by ``flowrl export`` is returned as
    given, as a checkpoint folder is (``exported=False``, for a resume: refused, as it has no trainer state)."""
    from flowrl.trainer.checkpoints.manifest import read_manifest

    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such run or checkpoint folder; check the path")
    manifest = read_manifest(path) if path.is_dir() else None
    if manifest is not None:
        if not exported:
            raise CheckpointError(exported_refusal(path))
        if which != "last":  # one checkpoint only, as a checkpoint folder
            raise CheckpointError(f"{path} is an exported folder (flowrl export) of one checkpoint (step"
                                  f" {manifest.step}), so checkpoint '{which}' cannot be chosen in it; drop the choice")
        return path
    recover(path / "checkpoints")
    if (path / STATE).exists():
        if which != "last":  # a choice among a run's checkpoints: refused, not ignored, for a checkpoint itself
            raise CheckpointError(f"{path} is a checkpoint folder, so checkpoint '{which}' cannot be chosen in it;"
                                  " give the run folder, or drop the choice")
        return path
    found = list_checkpoints(path / "checkpoints")
    steps = ", ".join(str(checkpoint_step(p)) for p in found) or "none"
    if which == BEST:
        best = path / "checkpoints" / BEST
        if best.is_dir() and not (best / STATE).exists():
            raise CheckpointError(f"{best} is incomplete (no {STATE}); choose a step ({steps}) or last")
        if not (best / STATE).exists():
            raise CheckpointError(f"{path}: no best checkpoint (trainer.keep_best needs evaluations); steps: {steps}")
        return best
    if which != "last":
        chosen = [p for p in found if checkpoint_step(p) == int(which)] if which.isdigit() else []
        if not chosen:
            raise CheckpointError(f"{path}: no checkpoint of step {which} (kept steps: {steps}; or best, last)")
        return chosen[0]
    if not found:
        raise CheckpointError(f"{path}: no checkpoint found (expected {path}/checkpoints/step_*/)")
    newer = [p for p in step_folders(path / "checkpoints")
             if not (p / STATE).exists() and checkpoint_step(p) > checkpoint_step(found[-1])]
    for skipped in sorted(newer, key=checkpoint_step):  # said, not silent: the user may have expected it
        print(f"note: {skipped} is incomplete (no {STATE}); using {found[-1].name}", file=sys.stderr)
    return found[-1]


def exported_refusal(folder: Path) -> str:
    """Why an exported folder cannot be resumed from, and what to give instead."""
    return (f"{folder} is an exported folder (flowrl export): it holds the weights, not the optimizer and trainer"
            " state a resume needs; resume from the run folder it was exported from")


def load_checkpoint(folder: Path) -> tuple[dict[str, Tensor], dict[str, Any], dict[str, Any]]:
    """(weights, state, extra) of a checkpoint folder; :class:`CheckpointError` when unreadable (or when it is a
    folder written by ``flowrl export``, which :func:`flowrl.export.loading.load_policy` reads instead)."""
    from flowrl.trainer.checkpoints.manifest import is_exported

    folder = Path(folder)
    if is_exported(folder):
        raise CheckpointError(exported_refusal(folder))
    name = WEIGHTS
    try:
        weights = load_file(str(folder / WEIGHTS))
        name = STATE
        state = json.loads((folder / STATE).read_text())
        name = "extra.pt"
        extra_path = folder / name
        extra = torch.load(extra_path, weights_only=False) if extra_path.exists() else {}
    except FileNotFoundError:  # (safetensors names no file in its error)
        raise CheckpointError(
            f"checkpoint {folder}: {name} is missing; use another checkpoint (an earlier step_* folder)"
        ) from None
    except Exception as error:  # truncated or corrupt files raise many types
        raise CheckpointError(
            f"checkpoint {folder}: {name} is truncated or corrupt ({type(error).__name__}: {error});"
            " use another checkpoint (an earlier step_* folder)"
        ) from None
    return weights, state, extra
