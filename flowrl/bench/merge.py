"""Several bench reports compared as one bench (``flowrl bench-merge``).

A method measured in an earlier report need not be trained again, and more seeds of a method (another report,
other seeds) join its earlier ones. Every comparison (pairwise tests, reach ratios on every axis the runs
share) is computed anew; the reports must use the same metric. With ``max_nfe`` every seed's curve is cut at
its first evaluation at or past that many rollout NFE, so longer runs compare at a shorter budget (with a
constant learning rate a run of budget N follows the same trajectory to that point); a cut run's final figure
is that evaluation's metric alone, and its cost figures (iteration seconds, outside share, peak memory) stay
those of the whole run.

A source is ``DIR`` (every method of its results.json) or ``DIR:NAME[=NEW],...`` (the methods named, each
optionally under a new name, so that one method measured under two protocols can stand side by side).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flowrl.bench.bench_errors import BenchError
from flowrl.bench.report import compare_methods, method_summary


def cut_seed(seed: dict[str, Any], max_nfe: float, metric: str) -> dict[str, Any]:
    """``seed`` (a results.json seed entry) as if its run had stopped at its first evaluation at or past
    ``max_nfe`` rollout NFE (unchanged when its curve ends before)."""
    curve = seed["curve"]
    ends = [i for i, nfe in enumerate(curve["nfe"]) if nfe >= max_nfe]
    if not ends or ends[0] == len(curve["nfe"]) - 1:
        return seed
    end = ends[0] + 1
    cut = {k: v[:end] for k, v in curve.items()}
    last = {k: cut[k][-1] for k in ("step", "nfe", "wall_s", "score")}
    return {**seed, "curve": cut, "final": {**last, "eval": {metric: last["score"]}}, "steps": last["step"],
            "nfe_used": last["nfe"], "wall_s": last["wall_s"]}


def parse_source(spec: str) -> tuple[Path, dict[str, str] | None]:
    """``DIR`` or ``DIR:NAME[=NEW],...``: the folder and the methods to take from it (each to its new name), or
    None for all of them."""
    folder, sep, names = spec.rpartition(":") if ":" in spec else (spec, "", "")
    if not sep:
        return Path(spec), None
    chosen = {}
    for item in names.split(","):
        old, _, new = item.partition("=")
        chosen[old.strip()] = (new or old).strip()
    return Path(folder), chosen


def merge_reports(sources: Sequence[str], reference: str, max_nfe: float | None = None) -> dict[str, Any]:
    """The results of the methods of ``sources`` (see the module's docstring) compared against ``reference``,
    as ``flowrl bench`` would have written them had it run them all; a :class:`BenchError` for a missing
    report, a method or seed given twice, mixed metrics or an unknown reference."""
    methods: dict[str, Any] = {}
    metrics: set[str] = set()
    for spec in sources:
        folder, chosen = parse_source(spec)
        path = folder / "results.json"
        if not path.is_file():
            raise BenchError(f"{path}: no such file (a flowrl bench report folder holds one)")
        results = json.loads(path.read_text())
        metrics.add(results["metric"])
        missing = [name for name in chosen or {} if name not in results["methods"]]
        if missing:
            raise BenchError(f"{spec}: no method '{missing[0]}' in {path} ({', '.join(results['methods'])})")
        for original, summary in results["methods"].items():
            if chosen is not None and original not in chosen:
                continue
            name = chosen[original] if chosen is not None else original
            if max_nfe is not None:
                summary = method_summary({k: cut_seed(v, max_nfe, results["metric"])
                                          for k, v in summary["seeds"].items()})
            if name in methods:  # more seeds of one method: the seeds join, the summary is computed anew
                shared = sorted(set(methods[name]["seeds"]) & set(summary["seeds"]), key=int)
                if shared:
                    raise BenchError(f"method '{name}' has seed {shared[0]} in more than one report ({path})")
                summary = method_summary({**methods[name]["seeds"], **summary["seeds"]})
            methods[name] = summary
    if len(metrics) != 1:
        raise BenchError(f"the reports use different metrics: {', '.join(sorted(metrics))}")
    if reference not in methods:
        raise BenchError(f"--reference {reference}: not a method of these reports ({', '.join(methods)})")
    return compare_methods(methods, reference, metrics.pop(), {"merged_from": list(sources)})
