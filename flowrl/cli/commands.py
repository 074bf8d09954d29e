"""The sub-commands. Each takes parsed arguments and returns an exit status."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from flowrl.config import ConfigError
from flowrl.prompts import PromptFileError
from flowrl.recipe import RecipeError, load_recipe
from flowrl.registry import KINDS, RegistryError, registry, summary
from flowrl.trainer.checkpoint import CheckpointError

USER_ERRORS = (RecipeError, PromptFileError, CheckpointError, ConfigError, RegistryError, FileNotFoundError)


def train(args: argparse.Namespace) -> int:
    from flowrl.trainer import train as run_training

    recipe = load_recipe(args.recipe, args.set)
    if args.resume and not args.output_dir:
        run_dir = Path(args.resume)
        run_dir = run_dir.parent.parent if run_dir.parent.name == "checkpoints" else run_dir
    else:
        run_dir = Path(args.output_dir or f"runs/{recipe.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    out = run_training(recipe, run_dir, resume=Path(args.resume) if args.resume else None, quiet=args.quiet)
    print(f"run folder: {out}")
    return 0


def validate(args: argparse.Namespace) -> int:
    failed = 0
    for path in args.recipes:
        try:
            load_recipe(path)
            print(f"ok  {path}")
        except RecipeError as error:
            failed += 1
            print(error.report())
    return 2 if failed else 0


def show(args: argparse.Namespace) -> int:
    print(load_recipe(args.recipe, args.set).to_toml(), end="")
    return 0


def ls(args: argparse.Namespace) -> int:
    kinds = args.kind or list(KINDS)
    for kind in kinds:
        reg = registry(kind)
        print(f"{kind}:")
        items = reg.items()
        width = max((len(name) for name, _ in items), default=0)
        for name, cls in items:
            print(f"  {name:<{width}}  {summary(cls)}")
    return 0


def evaluate(args: argparse.Namespace) -> int:
    from flowrl.loading import load_policy

    loaded = load_policy(Path(args.path))
    result = loaded.evaluate(limit=args.prompts, seed=args.seed)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>12}: {value}")
    return 0


def sample(args: argparse.Namespace) -> int:
    from flowrl.loading import load_policy
    from flowrl.trainer.logger import save_grid_png

    loaded = load_policy(Path(args.path))
    prompts = [p for p in args.prompt for _ in range(args.per_prompt)]
    images = loaded.images(prompts, seed=args.seed)
    save_grid_png(images, rows=len(args.prompt), path=Path(args.out))
    print(f"wrote {args.out} ({len(prompts)} images)")
    return 0
