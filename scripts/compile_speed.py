"""Seconds per iteration of embedded recipes with the transformer eager and compiled (``trainer.compile``).

    python scripts/compile_speed.py                        # every recipes/*.toml, 4 timed iterations each
    python scripts/compile_speed.py flow_grpo egrpo -n 6   # some recipes, more iterations
    python scripts/compile_speed.py --mode max-autotune-no-cudagraphs --markdown

For each recipe two trainers are built on the same seed, one eager and one with ``trainer.compile`` set to
``--mode``; their iterations alternate (eager, compiled, eager, ...), so load on the machine falls on both
alike. The first ``--warmup`` iterations of each are left out of the means (the compiled one compiles there,
and again where a new input shape appears); their extra time over the eager ones is printed as the compile
cost, with the number of iterations the speed-up needs to pay it back. Evaluation, checkpoints, images and the
drift probe are off; one torch thread. ``loss equal`` says whether the two trainers' losses agreed to a relative
1e-4 at every iteration (compiled kernels reorder float sums, so exact equality is not expected). A recipe
whose compiled run fails is reported with its error and the others go on.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from typing import Any

from update_speed import recipe_names, side_by_side  # the same harness: scripts/ is on the path when run


def measure(name: str, mode: str, iterations: int, warmup: int) -> dict[str, Any]:
    """Per variant: mean seconds per timed iteration and the warm-up seconds; whether the losses agreed."""
    import torch

    torch._dynamo.reset()  # each recipe compiles afresh: earlier recipes' graphs must not fill the cache
    variants = {"eager": "off", "compiled": mode}
    seconds: dict[str, list[float]] = {v: [] for v in variants}
    losses: dict[str, list[float]] = {v: [] for v in variants}
    with side_by_side(name, {v: f"trainer.compile={m}" for v, m in variants.items()}) as trainers:
        for _ in range(warmup + iterations):
            for variant, trainer in trainers.items():
                metrics = trainer.iteration()
                seconds[variant].append(metrics["time/iteration_s"])
                losses[variant].append(float(metrics.get("loss", math.nan)))
    equal = all(math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-6) for a, b in zip(*losses.values(), strict=True))
    return {
        "eager": statistics.fmean(seconds["eager"][warmup:]),
        "compiled": statistics.fmean(seconds["compiled"][warmup:]),
        "warmup_extra": sum(seconds["compiled"][:warmup]) - sum(seconds["eager"][:warmup]),
        "equal": equal,
    }


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = ["| recipe | s/it eager | s/it compiled | speed-up | compile cost (s) | iterations to pay it back |"
             " loss equal |", "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for name, r in results.items():
        if "error" in r:
            lines.append(f"| {name} | | | fails: {r['error']} | | | |")
            continue
        gain = r["eager"] - r["compiled"]
        payback = f"{r['warmup_extra'] / gain:.0f}" if gain > 0 else "never"
        lines.append(f"| {name} | {r['eager']:.2f} | {r['compiled']:.2f} | {r['eager'] / r['compiled']:.2f}x |"
                     f" {r['warmup_extra']:.0f} | {payback} | {'yes' if r['equal'] else 'no'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("recipes", nargs="*", help="recipe names under recipes/ (default: every one)")
    parser.add_argument("-n", "--iterations", type=int, default=4, help="timed iterations per variant (default 4)")
    parser.add_argument("--warmup", type=int, default=2, help="iterations left out of the means (default 2)")
    parser.add_argument("--mode", default="default", help="trainer.compile mode (default: default)")
    parser.add_argument("--markdown", action="store_true", help="print only the markdown table")
    args = parser.parse_args(argv)
    if args.iterations < 1 or args.warmup < 1:
        parser.error("--iterations and --warmup must be at least 1")
    import torch
    from tqdm.auto import tqdm

    torch.set_num_threads(1)
    names = recipe_names(args.recipes, "compile_speed")
    if names is None:
        return 2
    results: dict[str, Any] = {}
    for name in tqdm(names, desc="compile_speed", unit="recipe", disable=args.markdown):
        try:
            results[name] = measure(name, args.mode, args.iterations, args.warmup)
        except Exception as error:  # noqa: BLE001 -- reported in the table: a compile failure is a finding
            results[name] = {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"}
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
