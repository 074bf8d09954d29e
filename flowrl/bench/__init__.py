"""The benchmark harness: recipes x seeds under a fixed NFE budget, with a report.

:mod:`~flowrl.bench.run` trains the runs, :mod:`~flowrl.bench.report` turns run folders into
``results.json`` / ``results.md`` and :mod:`~flowrl.bench.plots` draws the curves. ``flowrl bench`` is
wired in :mod:`flowrl.cli.bench`. Importing this package stays light: the harness is loaded on use.
"""

from __future__ import annotations

from typing import Any

from flowrl.bench.bench_errors import BenchError


def __getattr__(name: str) -> Any:
    if name == "write_report":
        from flowrl.bench.report import write_report

        return write_report
    if name == "run_bench":
        from flowrl.bench.run import run_bench

        return run_bench
    raise AttributeError(f"module 'flowrl.bench' has no attribute {name!r}")


__all__ = ["BenchError", "run_bench", "write_report"]
