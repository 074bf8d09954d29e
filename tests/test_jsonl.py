"""The one JSON-lines reader and appender: a file torn anywhere in its last line (a kill mid-write) reads as the rows
before the tear, and the next append loses none of its own rows and leaves no damaged line behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowrl.utils.jsonl import DamagedRows, append_rows, mend_tail, read_rows

ROWS = st.lists(st.fixed_dictionaries({"key": st.text(max_size=6), "v": st.integers() | st.floats(allow_nan=False)}),
                min_size=1, max_size=6)


@settings(max_examples=150, deadline=None)
@given(rows=ROWS, new=ROWS, cut=st.floats(0, 1, exclude_max=True))
def test_a_torn_last_line_is_mended_before_the_next_append(tmp_path_factory: pytest.TempPathFactory,
                                                           rows: list[dict], new: list[dict], cut: float) -> None:
    path = tmp_path_factory.mktemp("rows") / "rows.jsonl"
    text = "".join(json.dumps(r) + "\n" for r in rows)
    last = len(json.dumps(rows[-1]))
    torn = text[: len(text) - 1 - last + int(cut * last)]  # the last row cut somewhere before its end
    path.write_text(torn)
    assert read_rows(path) == rows[:-1]
    append_rows(path, new)
    assert read_rows(path) == [*rows[:-1], *new]
    assert path.read_text().endswith("\n") and all(json.loads(line) for line in path.read_text().splitlines())


def test_a_complete_last_row_without_its_newline_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}')
    append_rows(path, [{"a": 3}])
    assert read_rows(path) == [{"a": 1}, {"a": 2}, {"a": 3}]


def test_a_long_torn_line_is_cut_across_blocks(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n{"a": "' + "x" * 200_000)
    mend_tail(path)
    assert path.read_text() == '{"a": 1}\n'
    path.write_text('{"a": "' + "x" * 200_000)  # a single torn line: the file becomes empty
    mend_tail(path)
    assert path.read_text() == ""


def test_a_damaged_earlier_line_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n{"a": \n{"a": 3}\n')
    with pytest.raises(DamagedRows, match=r"rows.jsonl: line 2"):
        read_rows(path)


def test_the_run_logger_appends_through_a_torn_metrics_line(tmp_path: Path) -> None:
    from flowrl.trainer.logger import RunLogger
    from flowrl.trainer.runfolder import read_metrics

    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "x": 1.0}\n{"step": 1, "x"')
    logger = RunLogger(tmp_path, recipe=None)
    logger.log({"step": 1, "x": 2.0})
    logger.close()
    assert read_metrics(tmp_path / "metrics.jsonl") == [{"step": 0, "x": 1.0}, {"step": 1, "x": 2.0}]
