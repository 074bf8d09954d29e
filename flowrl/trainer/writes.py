"""Writes into the run folder that the file system refuses: a full disk, a quota, a read-only or unwritable
folder. These are the user's to mend, not bugs: one line naming the path and the cause (exit status 2 from the
command line), and nothing half-written left behind by the caller."""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from flowrl.core.errors import UserError

REFUSALS = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exceeded",
            errno.EROFS: "the file system is read-only", errno.EACCES: "permission denied",
            errno.EPERM: "operation not permitted"}
FULL_BELOW = 1 << 20  # bytes free under which a failed write is taken for a full disk (torch.save's own errors
# name no cause: "unexpected pos ..." or "PytorchStreamWriter failed writing file")


class WriteRefused(UserError, OSError):
    """The file system refused a write into the run folder."""


WRITES_ONLY = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)  # refusals that only a write meets


def refusal(error: BaseException, path: Path) -> str | None:
    """Why the file system refused a write to ``path`` (None: ``error`` is not such a refusal). An error that
    names no cause (torch's writers) counts when the disk under ``path`` is all but full; a user error never."""
    if isinstance(error, UserError):
        return None
    if isinstance(error, OSError) and error.errno in REFUSALS:
        return REFUSALS[error.errno]
    if not isinstance(error, OSError | RuntimeError):
        return None
    try:
        free = shutil.disk_usage(next(p for p in (path, *path.parents) if p.exists())).free
    except (OSError, StopIteration):
        return None
    return "the disk is full" if free < FULL_BELOW else None


def refused(error: BaseException, path: Path, then: str) -> WriteRefused | None:
    """``error`` as a :class:`WriteRefused` naming the file (the error's own, else ``path``), the cause and ``then``
    (what to do next); None when it is no refused write."""
    cause = refusal(error, Path(path))
    if cause is None:
        return None
    named = getattr(error, "filename", None) or path
    code = error.errno if isinstance(error, OSError) else None
    verb = "cannot use" if code in (errno.EACCES, errno.EPERM) else "cannot write"  # a read may meet these too
    return WriteRefused(f"{verb} {named}: {cause}; {then}")


@contextmanager
def refused_writes(path: Path, then: str) -> Iterator[None]:
    """Turn a write the file system refuses under ``path`` into a :class:`WriteRefused` (:func:`refused`); any
    other error passes unchanged."""
    try:
        yield
    except WriteRefused:
        raise
    except Exception as error:
        found = refused(error, Path(path), then)
        if found is None:
            raise
        raise found from error


def write_probe(folder: Path) -> str | None:
    """Why no file can be written into the existing ``folder`` (None: one can): a probe file is written and removed
    again (root passes permission bits, so only writing tells)."""
    probe = folder / f".flowrl-probe-{os.getpid()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        return REFUSALS.get(error.errno or 0, error.strerror or str(error))
    return None


def check_writable(folder: Path, option: str) -> None:
    """Create ``folder``, write a probe file in it (:func:`write_probe`) and remove both again, before any model
    loads: a :class:`WriteRefused` naming ``option`` where that fails."""
    made = [p for p in (folder, *folder.parents) if not p.exists()]  # removed again: nothing is left behind
    try:
        folder.mkdir(parents=True, exist_ok=True)
        cause = write_probe(folder)
        for created in made:
            created.rmdir()
    except OSError as error:
        cause = REFUSALS.get(error.errno or 0, error.strerror or str(error))
    if cause is not None:
        raise WriteRefused(f"{option} {folder}: cannot write there ({cause}); choose another {option}")
