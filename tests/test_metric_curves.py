"""scripts/metric_curves.py: the running mean, the series read from metrics.jsonl, the PNG, and the one-line error."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import metric_curves  # noqa: E402


def _run(folder: Path, rows: list[dict]) -> Path:
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_running_mean_and_series(tmp_path: Path) -> None:
    assert metric_curves.running_mean([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    run = _run(tmp_path / "crd" / "seed0", [{"step": 0, "eval/strict": 0.3}, {"step": 1, "kl": 0.5},
                                            {"step": 2, "kl": 0.25, "eval/strict": 0.4}, {"kl": 9.0}])
    assert metric_curves.series(run, "kl") == ([1.0, 2.0], [0.5, 0.25])  # a row without a step is not drawn
    assert metric_curves.series(run, "eval/strict") == ([0.0, 2.0], [0.3, 0.4])


def test_writes_a_png_and_names_a_folder_without_metrics(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    runs = [_run(tmp_path / m / f"seed{s}", [{"step": k, "kl": 0.1 * k + s} for k in range(5)])
            for m in ("a", "b") for s in (0, 1)]
    out = tmp_path / "c.png"
    assert metric_curves.main([*map(str, runs), "--keys", "kl,missing", "--out", str(out), "--smooth", "3",
                               "--log", "kl"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert metric_curves.main([str(tmp_path / "nowhere"), "--keys", "kl", "--out", str(out)]) == 2
    assert "nowhere: no metrics.jsonl" in capsys.readouterr().err
