"""A run folder holds one run's truth: a lock against a second writer, and a metrics reader that survives a crash.

Two ``flowrl train`` processes writing one folder would interleave their ``metrics.jsonl`` lines and leave
the last writer's ``recipe.toml``; :func:`lock_run_folder` takes an exclusive advisory lock on
``<run>/.lock`` for the life of the trainer (released by the operating system if the process dies).
A crash in the middle of a write can leave a torn last line in ``metrics.jsonl``; :func:`read_metrics`
drops it (the iteration it described is run again on resume) and refuses a corrupt line elsewhere.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, Any

from flowrl.errors import UserError
from flowrl.jsonl import read_rows

LOCK = ".lock"


class RunFolderError(UserError, ValueError):
    """The output folder already holds a run that a fresh run would overwrite, or another process uses it."""


def lock_run_folder(run_dir: Path) -> IO[str] | None:
    """Create ``run_dir`` and hold an exclusive lock on it; :class:`RunFolderError` if another process holds it.
    Returns the open lock file (keep it open for as long as the run writes); None where locks are unsupported."""
    try:
        import fcntl
    except ImportError:  # Windows: no advisory locks; the metrics.jsonl check still guards a finished run
        return None
    run_dir.mkdir(parents=True, exist_ok=True)
    handle = (run_dir / LOCK).open("a+")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise RunFolderError(
            f"run folder {run_dir} is in use by {holder}; wait for it to finish or choose another --output-dir"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"flowrl train (pid {os.getpid()})\n")
    handle.flush()
    return handle


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl``; a torn last line (a crash mid-write) is dropped, a corrupt earlier
    line is a :class:`RunFolderError` naming the file and the line."""
    return read_rows(path, RunFolderError, "the run folder is damaged")


def check_history(run_dir: Path, checkpoint: Path, step: int, log_every: int) -> None:
    """Before a run resumes in its own folder: ``metrics.jsonl`` must hold the rows up to the checkpoint's
    ``step`` (a missing or cut file would silently lose them); a :class:`RunFolderError` naming it otherwise.
    A checkpoint from elsewhere (resumed into a new folder) starts a new history."""
    if Path(checkpoint).resolve().parent.parent != Path(run_dir).resolve():
        return
    path = Path(run_dir) / "metrics.jsonl"
    fix = f"restore it, or resume from {checkpoint} into a new --output-dir"
    if not path.exists():
        if step == 0:  # stopped before anything was logged (a reward server lost in the first iteration)
            return
        raise RunFolderError(f"{path} is missing: resuming at step {step} would lose the run's history; {fix}")
    steps = [int(row.get("step", -1)) for row in read_metrics(path) if isinstance(row, dict)]
    last = max(steps, default=-1)
    if step > 0 and last + log_every <= step:
        raise RunFolderError(f"{path} ends at step {last} but the checkpoint is at step {step} (the file was cut);"
                             f" {fix}")


def already_a_run(run_dir: Path, checkpointed: bool) -> RunFolderError:
    """The refusal of a fresh run in a folder that holds one: continue it with ``--resume`` where it has a
    checkpoint (``checkpointed``); where it stopped before its first one there is nothing to continue, so the
    folder is to be removed or another chosen (never advice that the other command would refuse)."""
    if checkpointed:
        return RunFolderError(f"run folder {run_dir} already holds a run (metrics.jsonl); continue it with --resume "
                              "or choose another --output-dir")
    return RunFolderError(f"run folder {run_dir} holds a run that stopped before its first checkpoint (nothing to "
                          "--resume); remove the folder or choose another --output-dir")
