"""JSON-lines files that survive a kill: the one reader and the one appender every flowrl file of rows goes through
(``metrics.jsonl``, a suite's manifests and scores).

A process killed in the middle of a write leaves a torn last line. The reader drops it (the row it held is made
again by whoever wrote it) and refuses a damaged line anywhere else. The appender mends the tail before it writes:
a torn fragment is cut off, and a complete last row that only lacks its newline gets one. Appending straight
after a torn fragment would glue the next row onto it, losing that row and leaving a damaged line in the middle
of the file, which every later read refuses.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from flowrl.core.errors import UserError

BLOCK = 1 << 16


class DamagedRows(UserError, ValueError):
    """A JSON-lines file with a damaged line before its last one; the message names the file and the line."""


def read_rows(path: Path, error: type[Exception] = DamagedRows,
              what: str = "the file is damaged") -> list[dict[str, Any]]:
    """The rows (JSON objects) of ``path`` ([] when it does not exist); a torn last line is dropped, a damaged
    earlier one raises ``error`` naming the file, the line and ``what``."""
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    rows = []
    for number, line in enumerate(lines, 1):
        row = _row(line)
        if row is None:
            if number == len(lines):
                break  # torn by a kill: the writer makes that row again
            raise error(f"{path}: line {number} is not a JSON object; {what}")
        rows.append(row)
    return rows


def _row(line: str | bytes) -> dict[str, Any] | None:
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return row if isinstance(row, dict) else None


def mend_tail(path: Path) -> None:
    """Make ``path`` end at a line boundary: cut a torn last fragment, or end a complete last row with its newline."""
    path = Path(path)
    if not path.exists():
        return
    with path.open("r+b") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        start = size  # find the start of the last line, reading back a block at a time
        while start > 0:
            begin = max(0, start - BLOCK)
            f.seek(begin)
            block = f.read(start - begin)
            found = block.rfind(b"\n")
            if found >= 0:
                start = begin + found + 1
                break
            start = begin
        f.seek(start)
        if _row(f.read(size - start)) is not None:
            f.seek(size)
            f.write(b"\n")
        else:
            f.truncate(start)


def append_rows(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    """Append ``rows`` to ``path`` (created if missing), one JSON object a line, after mending a torn tail; the
    rows go out in one write, so a kill tears at most the last of them."""
    text = "".join(json.dumps(row) + "\n" for row in rows)
    if not text:
        return
    mend_tail(path)
    with Path(path).open("a", encoding="utf-8") as f:
        f.write(text)
