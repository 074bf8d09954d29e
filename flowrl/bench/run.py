"""The bench harness: every recipe x seed trained in turn, in this process, under one NFE budget; then the report.

Each run goes to ``DIR/runs/<recipe name>/seed<k>/`` with the overrides of :func:`bench_overrides` (then the
user's ``--set``). After a run the harness writes ``final_eval.json`` there: the held-out figures of the
final weights (the trainer evaluates only every ``eval_every`` iterations, so its last evaluation may be
older than the budget's end). That file also marks the run complete: with ``--resume`` a complete run of
the same resolved recipe is reused, an interrupted one continues from its newest checkpoint, and one that
differs only in a smaller budget is extended: it continues from its newest checkpoint to the new budget.
Nothing in a run depends on its budget (the learning-rate schedule is a warm-up only), so an extended run
trains exactly as a run given the larger budget from the start.
"""

from __future__ import annotations

import contextlib
import gc
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flowrl.bench.bench_errors import BenchError
from flowrl.bench.report import FINAL_EVAL, write_report
from flowrl.config.recipe import Recipe, RecipeError, load_recipe

# The keys a run may grow when it is extended to a larger budget (the bench sets both to --nfe-budget).
BUDGET_KEYS = ("trainer.max_nfe", "trainer.max_steps")
# Keys that only watch a run (the health alerts read its metrics and change nothing): a finished or interrupted
# run that differs from the asked recipe only in these is reused or continued, not trained again (its rows keep
# the alert flags of the settings it ran with).
WATCH_KEYS = ("trainer.alert_diversity", "trainer.alert_eval_falls")
# Recipe keys the harness sets itself, and the option that sets each.
BENCH_KEYS = {
    "seed": "--seeds",
    "trainer.max_nfe": "--nfe-budget",
    "trainer.eval_every": "--eval-every",
    "trainer.eval_every_nfe": "--eval-every-nfe",
    "trainer.eval_prompts": "--eval-prompts",
}


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2"`` -> ``[0, 1, 2]``: distinct non-negative integers, at least one."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise BenchError("--seeds: no seeds given (expected e.g. --seeds 0,1,2)")
    seeds = []
    for item in items:
        if not item.isdigit():
            raise BenchError(f"--seeds: '{item}' is not a non-negative integer (expected e.g. --seeds 0,1,2)")
        seeds.append(int(item))
    if len(set(seeds)) != len(seeds):
        raise BenchError(f"--seeds: a seed is repeated in {text!r}")
    return seeds


def bench_overrides(seed: int, nfe_budget: int, eval_every: int, eval_prompts: int | None,
                    eval_every_nfe: int = 0) -> list[str]:
    """The ``--set`` items the harness applies to every run (before the user's own)."""
    items = [
        f"seed={seed}",
        f"trainer.max_nfe={nfe_budget}",
        # Every iteration costs at least one NFE, so the budget also bounds the iterations; it stops first.
        f"trainer.max_steps={nfe_budget}",
        "trainer.max_minutes=0",  # equal NFE, not equal time: a recipe's time limit would cut a run short
        f"trainer.eval_every={eval_every}",
        f"trainer.eval_every_nfe={eval_every_nfe}",
        "trainer.checkpoint_every=0",
        "trainer.image_every=0",
    ]
    if eval_prompts is not None:
        items.append(f"trainer.eval_prompts={eval_prompts}")
    return items


def check_options(seeds: Sequence[int], nfe_budget: int, eval_every: int, eval_prompts: int | None,
                  overrides: Sequence[str], eval_every_nfe: int = 0) -> None:
    if not seeds:
        raise BenchError("--seeds: no seeds given (expected e.g. --seeds 0,1,2)")
    if nfe_budget <= 0:
        raise BenchError(f"--nfe-budget: must be a positive number of transformer evaluations, got {nfe_budget}")
    if eval_every < 0 or eval_every_nfe < 0 or not (eval_every or eval_every_nfe):
        given = f"--eval-every {eval_every}, --eval-every-nfe {eval_every_nfe}"
        raise BenchError(f"--eval-every / --eval-every-nfe: one must be positive (the report needs curves): {given}")
    if eval_prompts is not None and eval_prompts <= 0:
        raise BenchError(f"--eval-prompts: must be positive, got {eval_prompts}")
    for item in overrides:
        key = item.partition("=")[0].strip()
        if key in BENCH_KEYS:
            raise BenchError(f"--set {key}: the bench sets this key; use {BENCH_KEYS[key]} instead")


def load_recipes(paths: Sequence[str | Path], seeds: Sequence[int], overrides_for: Any) -> dict[str, dict[int, Recipe]]:
    """Every recipe for every seed, validated before any model loads; name -> seed -> recipe."""
    plan: dict[str, dict[int, Recipe]] = {}
    sources: dict[str, str] = {}
    errors: list[RecipeError] = []
    for path in paths:
        try:
            by_seed = {seed: load_recipe(path, overrides_for(seed)) for seed in seeds}
        except RecipeError as error:
            errors.append(error)
            continue
        name = by_seed[seeds[0]].name
        if name in plan:
            raise BenchError(f"{sources[name]} and {path} are both named '{name}'; give each recipe a distinct name")
        plan[name], sources[name] = by_seed, str(path)
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise BenchError("\n".join(error.report() for error in errors))
    precisions = {name: r[seeds[0]].trainer.mixed_precision for name, r in plan.items()}
    if len(set(precisions.values())) > 1:
        listed = ", ".join(f"{n}: {p}" for n, p in precisions.items())
        raise BenchError(
            f"the recipes use different trainer.mixed_precision ({listed}); one process cannot switch it,"
            " so pass --set trainer.mixed_precision=... or bench them separately"
        )
    for name, by_seed in plan.items():
        if not by_seed[seeds[0]].build("prompts").heldout():
            raise BenchError(f"{sources[name]}: [prompts] has no held-out prompts; the bench scores held-out prompts")
    return plan


def same_recipe(run_dir: Path, recipe: Recipe) -> bool:
    """``run_dir`` was started with this resolved recipe (same seed, budget, evaluation, overrides), up to the
    settings that only watch a run (:data:`WATCH_KEYS`)."""
    recipe_file = run_dir / "recipe.toml"
    if recipe_file.is_file() and recipe_file.read_text() == recipe.to_toml():
        return True
    changes = changes_since(run_dir, recipe)
    return changes is not None and all(key in WATCH_KEYS for key, _, _ in changes)


def changes_since(run_dir: Path, recipe: Recipe) -> list[tuple[str, Any, Any]] | None:
    """What ``recipe`` changes in the recipe ``run_dir`` was started with (``(key, before, after)``), or None
    when the folder has no recipe this version reads (the run is then trained again)."""
    import tomllib

    from flowrl.trainer.checkpoints.resume import recipe_changes, saved_settings

    saved = run_dir / "recipe.toml"
    if not saved.is_file():
        return None
    try:
        before = saved_settings(saved)
    except (RecipeError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return None
    return recipe_changes(before, recipe.to_dict())


def is_complete(run_dir: Path, recipe: Recipe) -> bool:
    """A finished bench run of this resolved recipe (:func:`same_recipe`)."""
    return (run_dir / FINAL_EVAL).is_file() and (run_dir / "metrics.jsonl").is_file() and same_recipe(run_dir, recipe)


def can_continue(run_dir: Path, recipe: Recipe) -> bool:
    """An interrupted run of this resolved recipe (:func:`same_recipe`) with a checkpoint to continue from."""
    return same_recipe(run_dir, recipe) and has_checkpoint(run_dir)


def has_checkpoint(run_dir: Path) -> bool:
    """``run_dir`` holds a step checkpoint to continue from."""
    return any((run_dir / "checkpoints").glob("step_*"))


def can_extend(run_dir: Path, recipe: Recipe) -> bool:
    """A run with a checkpoint whose recipe differs from ``recipe`` only in a smaller budget (:data:`BUDGET_KEYS`):
    continuing it to ``recipe``'s budget gives the run ``recipe`` describes."""
    if not has_checkpoint(run_dir):
        return False
    changes = changes_since(run_dir, recipe) or []
    return bool(changes) and all(
        key in BUDGET_KEYS and isinstance(old, int) and isinstance(new, int) and 0 < old < new
        for key, old, new in changes
    )


def check_damage(run_dir: Path) -> None:
    """Before ``--resume`` decides what to do with ``run_dir``: a run whose own files are damaged (missing beside
    the others, not UTF-8, not TOML or JSON) is a :class:`BenchError` naming the file, and the folder is kept
    (training it again from scratch would silently replace a run that may have finished)."""
    import tomllib

    if not run_dir.is_dir():
        return
    present = {p.name for p in run_dir.iterdir()}
    if not present & {"recipe.toml", "metrics.jsonl"}:
        return
    keep = f"the bench keeps the run: restore the file, or delete {run_dir} to train it again"
    required = ["recipe.toml"] + (["metrics.jsonl"] if has_checkpoint(run_dir) or FINAL_EVAL in present else [])
    for name in required:
        if name not in present:
            raise BenchError(f"{run_dir / name} is missing; {keep}")
    for name, parse in (("recipe.toml", tomllib.loads), (FINAL_EVAL, json.loads), ("metrics.jsonl", None)):
        path = run_dir / name
        if name not in present:
            continue
        try:
            text = path.read_text(encoding="utf-8")
            if parse is not None:
                parse(text)
        except (UnicodeDecodeError, ValueError) as error:  # TOMLDecodeError and JSONDecodeError are ValueErrors
            raise BenchError(f"{path} is damaged ({type(error).__name__}); {keep}") from None


def clear_run_dir(run_dir: Path) -> None:
    """Remove an earlier run in ``run_dir`` (the trainer would append to its metrics)."""
    import shutil

    if not run_dir.exists():
        return
    names = {p.name for p in run_dir.iterdir()} if run_dir.is_dir() else {"?"}
    if names and not names & {"recipe.toml", "metrics.jsonl"}:
        raise BenchError(f"{run_dir} exists and is not a run folder; choose another --output-dir")
    shutil.rmtree(run_dir)


def reset_peak_memory() -> None:
    """Start a run's ``mem/peak_mb`` afresh: CUDA's allocator peak, and on Linux the process's peak RSS."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM, which ru_maxrss reports


def train_one(recipe: Recipe, run_dir: Path, quiet: bool, continue_run: bool = False) -> None:
    """Train one run into ``run_dir`` (afresh, or from its newest checkpoint) and write ``final_eval.json``."""
    from flowrl.trainer import Trainer
    from flowrl.trainer.run_errors import NonFiniteError, NothingTrainedError

    if continue_run:
        # An extended run's old final figures must not mark it complete if this continuation is interrupted.
        (run_dir / FINAL_EVAL).unlink(missing_ok=True)
    else:
        clear_run_dir(run_dir)
    reset_peak_memory()
    trainer = Trainer(recipe, run_dir, resume=run_dir if continue_run else None, quiet=quiet)
    try:
        trainer.run()
    except (NonFiniteError, NothingTrainedError) as error:
        raise BenchError(f"{recipe.name} seed {recipe.seed}: {error} (finished runs are kept: --resume)") from error
    cfg = recipe.trainer
    if trainer.step < cfg.max_steps and not (cfg.max_nfe and trainer.nfe >= cfg.max_nfe):
        # The trainer returns early on SIGINT/SIGTERM: not a finished run, and the bench stops too.
        raise KeyboardInterrupt
    last = _last_row(run_dir / "metrics.jsonl")
    if last.get("step") == trainer.step and any(k.startswith("eval/") for k in last):
        figures, source = {k: v for k, v in last.items() if k.startswith("eval/")}, "metrics.jsonl"
    else:
        figures, source = trainer.evaluate(), "bench"
    final = {"step": trainer.step, "wall_s": round(trainer.wall, 4), "nfe": trainer.nfe, "rows": trainer.rows,
             **figures, "source": source}
    tmp = run_dir / (FINAL_EVAL + ".tmp")
    tmp.write_text(json.dumps(final) + "\n")
    tmp.replace(run_dir / FINAL_EVAL)
    del trainer
    gc.collect()


def _last_row(path: Path) -> dict[str, Any]:
    lines = [line for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    return json.loads(lines[-1]) if lines else {}


def run_bench(
    recipes: Sequence[str | Path],
    seeds: Sequence[int],
    nfe_budget: int,
    output_dir: Path,
    *,
    eval_every: int | None = None,
    eval_every_nfe: int | None = None,
    eval_prompts: int | None = None,
    overrides: Sequence[str] = (),
    reference: str | None = None,
    metric: str | None = None,
    resume: bool = False,
    quiet: bool = False,
) -> dict[str, Any]:
    """Train every recipe x seed under ``nfe_budget`` rollout NFE, then write the report; return the results.

    Evaluations: every ``eval_every`` iterations (default 5 when ``eval_every_nfe`` is not given) and/or each
    time the rollouts pass a multiple of ``eval_every_nfe`` NFE."""
    from tqdm.auto import tqdm

    every_nfe = eval_every_nfe or 0
    every = (0 if every_nfe else 5) if eval_every is None else eval_every
    check_options(seeds, nfe_budget, every, eval_prompts, overrides, every_nfe)
    plan = load_recipes(
        recipes, seeds, lambda seed: [*bench_overrides(seed, nfe_budget, every, eval_prompts, every_nfe), *overrides]
    )
    if reference is not None and reference not in plan:
        raise BenchError(f"--reference: no recipe is named '{reference}' (names: {', '.join(plan)})")
    output_dir = Path(output_dir)
    runs: dict[str, dict[int, Path]] = {}
    reused: list[str] = []
    continued: list[str] = []
    extended: list[str] = []
    start = time.perf_counter()
    if resume:  # every run folder checked before any training: a damaged one stops the bench, kept as it is
        for name, by_seed in plan.items():
            for seed in by_seed:
                check_damage(output_dir / "runs" / name / f"seed{seed}")
    with tqdm(total=len(plan) * len(seeds), desc="bench", unit="run") as bar:
        for name, by_seed in plan.items():
            for seed, recipe in by_seed.items():
                run_dir = output_dir / "runs" / name / f"seed{seed}"
                bar.set_postfix_str(f"{name} seed {seed}")
                if resume and is_complete(run_dir, recipe):
                    reused.append(f"{name}/seed{seed}")
                elif resume and can_continue(run_dir, recipe):
                    continued.append(f"{name}/seed{seed}")
                    train_one(recipe, run_dir, quiet, continue_run=True)
                elif resume and can_extend(run_dir, recipe):
                    extended.append(f"{name}/seed{seed}")
                    train_one(recipe, run_dir, quiet, continue_run=True)
                else:
                    train_one(recipe, run_dir, quiet)
                runs.setdefault(name, {})[seed] = run_dir
                bar.update(1)
    meta = {
        "recipes": [str(p) for p in recipes],
        "seeds": list(seeds),
        "nfe_budget": nfe_budget,
        "eval_every": every,
        "eval_every_nfe": every_nfe,
        "eval_prompts": eval_prompts,
        "overrides": list(overrides),
        "resume": resume,
        "reused": reused,
        "continued": continued,
        "extended": extended,
        "bench_s": round(time.perf_counter() - start, 2),
    }
    try:
        return write_report(runs, output_dir, reference, metric, meta)
    except BenchError as error:
        raise BenchError(f"{error} (the runs are kept: rerun with --resume --output-dir {output_dir})") from error
