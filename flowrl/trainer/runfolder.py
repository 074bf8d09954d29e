"""A run folder holds one run's truth: a lock against a second writer, and a metrics reader that survives a crash.
:class:`RunFolder` is its one owner: the command line names and checks it, the trainer locks it and writes there.

Two ``flowrl train`` processes writing one folder would interleave their ``metrics.jsonl`` lines and leave
the last writer's ``recipe.toml``; :func:`lock_run_folder` takes an exclusive advisory lock on
``<run>/.lock`` for the life of the trainer (released by the operating system if the process dies).
A crash in the middle of a write can leave a torn last line in ``metrics.jsonl``; :func:`read_metrics`
drops it (the iteration it described is run again on resume) and refuses a corrupt line elsewhere.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from tqdm.auto import tqdm

from flowrl.trainer.checkpoints.folder import list_checkpoints
from flowrl.trainer.run_errors import RunFolderError
from flowrl.trainer.writes import check_writable, refused_writes
from flowrl.utils.jsonl import read_rows

LOCK = ".lock"


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


class RunFolder:
    """One run's folder, from its name to its last write: the checks before any model loads (:meth:`check`), the one
    writer's lock (:meth:`open`, :meth:`release`), a fresh run refused where a run is (:func:`already_a_run`), the
    history a resume needs (:func:`check_history`), the settings kept across a resume, and every write the file
    system refuses turned into one line (:meth:`refused_writes`)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._lock: IO[str] | None = None

    @classmethod
    def for_training(cls, name: str, output_dir: str | None, resume: str | None) -> RunFolder:
        """``--output-dir``; else the resumed run's own folder (``--resume RUN`` or ``RUN/checkpoints/step_N``);
        else ``runs/<name>-<date>-<time>``."""
        if resume and not output_dir:
            folder = Path(resume)
            return cls(folder.parent.parent if folder.parent.name == "checkpoints" else folder)
        return cls(Path(output_dir or f"runs/{name}-{time.strftime('%Y%m%d-%H%M%S')}"))

    def check(self, probe: bool = True) -> None:
        """Before any model loads: the folder can be made (no file in its place) and, where ``probe`` (one process
        probes: another's probe could vanish under it), written."""
        blocked = next((p for p in (self.path, *self.path.parents) if p.exists() and not p.is_dir()), None)
        if blocked is not None:
            raise RunFolderError(f"--output-dir {self.path}: {blocked} is a file, not a folder; choose another "
                                 "--output-dir")
        if probe:
            check_writable(self.path, "--output-dir")

    @contextmanager
    def refused_writes(self) -> Iterator[None]:
        """A write the file system refuses anywhere in the run (full, read-only, unwritable): one line naming the
        file (:class:`flowrl.trainer.writes.WriteRefused`)."""
        with refused_writes(self.path, "free space (or mend the folder) and continue with --resume"):
            yield

    def open(self, main_process: bool, resuming: bool) -> None:
        """Take the writer's lock (the main process), then refuse a fresh run where a run is: the lock comes before
        the check, so two runs started together cannot both pass it."""
        self._lock = lock_run_folder(self.path) if main_process else None
        if not resuming and (self.path / "metrics.jsonl").exists():
            self.release()
            raise already_a_run(self.path, bool(list_checkpoints(self.path / "checkpoints")))

    def release(self) -> None:
        """Give up the lock (after the last write; another process may then resume the run)."""
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def check_history(self, checkpoint: Path, step: int, log_every: int) -> None:
        check_history(self.path, checkpoint, step, log_every)

    def write_recipe(self, recipe_toml: str, resumed: tuple[Path, int, list[tuple[str, Any, Any]]] | None) -> None:
        """``recipe.toml``; on a resume with changed settings ``(checkpoint, step, changes)`` the settings that ran
        up to ``step`` are kept first as ``recipe.step_<step>.toml``, and a one-line note is printed."""
        if resumed is not None and resumed[2]:
            checkpoint, step, changes = resumed
            kept = self.path / f"recipe.step_{step:06d}.toml"
            kept.write_bytes((Path(checkpoint) / "recipe.toml").read_bytes())
            listed = ", ".join(f"{k} {old!r} -> {new!r}" for k, old, new in changes)
            tqdm.write(f"resumed at step {step} with changed settings: {listed} (the settings before: {kept})",
                       file=sys.stderr)
        (self.path / "recipe.toml").write_text(recipe_toml)
