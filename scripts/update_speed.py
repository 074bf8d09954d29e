"""Seconds and transformer forwards per iteration of every embedded recipe, for each update mode, side by side.

    python scripts/update_speed.py                       # every recipes/*.toml, 4 timed iterations each
    python scripts/update_speed.py flow_grpo egrpo -n 8  # some recipes, more iterations
    python scripts/update_speed.py --markdown            # the table as docs/performance.md shows it

For each recipe one trainer per mode (``trainer.update = "recompute"`` and, where it is exact, ``"retain"``)
is built on the same seed; their iterations alternate (recompute, retain, recompute, ...), so load on the
machine falls on both alike. One warm-up iteration each is left out. Evaluation, checkpoints, images and the
drift probe are off; one torch thread. Printed per recipe and mode: mean seconds per iteration, transformer
forwards per iteration (rollout plus update), time outside the transformer (``time/outside_share``), the
ratio recompute / retain, and the size of the graphs retain keeps from the rollout to the update. The
rollouts of the two modes are the same; the float rounding of their updates differs, so later iterations draw
slightly different samples.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OFF = ["trainer.eval_every=0", "trainer.eval_every_nfe=0", "trainer.kl_every=0", "trainer.max_minutes=0",
       "trainer.checkpoint_every=0", "trainer.image_every=0", "trainer.torch_threads=1", "trainer.max_steps=1000"]


@contextmanager
def side_by_side(name: str, variants: dict[str, str]) -> Iterator[dict[str, Any]]:
    """One trainer per variant of ``recipes/<name>.toml`` (variant -> its one override, after :data:`OFF`), each in
    its own folder of a temporary directory; their loggers closed and resources released on exit."""
    from flowrl.config.recipe import load_recipe
    from flowrl.trainer.loop import Trainer

    path = ROOT / "recipes" / f"{name}.toml"
    with tempfile.TemporaryDirectory() as tmp:
        trainers = {v: Trainer(load_recipe(path, [*OFF, override]), Path(tmp) / v, quiet=True)
                    for v, override in variants.items()}
        try:
            yield trainers
        finally:
            for trainer in trainers.values():
                trainer.logger.close()  # the TensorBoard writer's thread, before the folder goes
                trainer.release()


def recipe_names(requested: list[str], tool: str) -> list[str] | None:
    """``requested`` (default: every ``recipes/*.toml``), or None after a one-line error naming a missing one."""
    names = requested or sorted(p.stem for p in (ROOT / "recipes").glob("*.toml"))
    missing = [n for n in names if not (ROOT / "recipes" / f"{n}.toml").is_file()]
    if missing:
        print(f"{tool}: no recipe recipes/{missing[0]}.toml", file=sys.stderr)
        return None
    return names


def measure(name: str, iterations: int) -> dict[str, dict[str, float]]:
    """Per mode: seconds, forwards and outside share per iteration (means over the timed iterations)."""
    from flowrl.config.recipe import load_recipe
    from flowrl.config.update_modes import resolve_update

    path = ROOT / "recipes" / f"{name}.toml"
    modes = ["recompute"] + (["retain"] if resolve_update(load_recipe(path)) == "retain" else [])
    figures: dict[str, dict[str, list[float]]] = {m: {"s": [], "forwards": [], "outside": [], "mb": []} for m in modes}
    with side_by_side(name, {m: f"trainer.update={m}" for m in modes}) as trainers:
        for k in range(iterations + 1):
            for mode, trainer in trainers.items():
                nfe0 = trainer.backbone.nfe
                metrics = trainer.iteration()
                if k == 0:
                    continue  # warm-up
                figures[mode]["s"].append(metrics["time/iteration_s"])
                figures[mode]["forwards"].append(trainer.backbone.nfe - nfe0)
                figures[mode]["outside"].append(metrics["time/outside_share"])
                figures[mode]["mb"].append(metrics.get("update/retained_mb", 0.0))
    return {m: {key: statistics.fmean(values) for key, values in f.items()} for m, f in figures.items()}


def table(results: dict[str, dict[str, dict[str, float]]]) -> str:
    lines = ["| recipe | s/it recompute | s/it retain | speed-up | forwards/it recompute | forwards/it retain |"
             " outside share recompute | outside share retain | retained graphs (MB) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, modes in results.items():
        a, b = modes["recompute"], modes.get("retain")
        if b is None:
            lines.append(f"| {name} | {a['s']:.2f} | (recompute only) | | {a['forwards']:.0f} | |"
                         f" {a['outside']:.1%} | | |")
            continue
        lines.append(f"| {name} | {a['s']:.2f} | {b['s']:.2f} | {a['s'] / b['s']:.2f}x | {a['forwards']:.0f} |"
                     f" {b['forwards']:.0f} | {a['outside']:.1%} | {b['outside']:.1%} | {b['mb']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("recipes", nargs="*", help="recipe names under recipes/ (default: every one)")
    parser.add_argument("-n", "--iterations", type=int, default=4, help="timed iterations per mode (default 4)")
    parser.add_argument("--markdown", action="store_true", help="print only the markdown table")
    args = parser.parse_args(argv)
    if args.iterations < 1:
        parser.error("--iterations must be at least 1")
    import torch
    from tqdm.auto import tqdm

    torch.set_num_threads(1)
    names = recipe_names(args.recipes, "update_speed")
    if names is None:
        return 2
    results: dict[str, Any] = {}
    for name in tqdm(names, desc="update_speed", unit="recipe", disable=args.markdown):
        results[name] = measure(name, args.iterations)
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
