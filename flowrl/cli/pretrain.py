"""``flowrl pretrain`` arguments: pre-train the embedded world's base model from a pre-training recipe.

Module-level imports stay light (no torch) so ``flowrl --help`` is quick; the work is in
:mod:`flowrl.pretrain.trainer`.
"""

from __future__ import annotations

import argparse

from flowrl.cli.options import ExistingPath, KeyValue, OutputFolder


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", type=ExistingPath("file"),
                        help="a pre-training recipe, e.g. recipes/pretrain/world.toml")
    parser.add_argument(
        "--set", action="append", default=[], type=KeyValue(), metavar="KEY=VALUE",
        help="override a recipe key (train.steps=100)",
    )
    parser.add_argument("--output-dir", default=None, type=OutputFolder(),
                        help="where to save the pipeline (default: the recipe's)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from flowrl.pretrain import load_pretrain_recipe, pretrain

    recipe = load_pretrain_recipe(args.recipe, args.set)
    result = pretrain(recipe, args.output_dir, quiet=args.quiet)
    if result.evals:
        last = result.evals[-1]
        print(
            f"{result.output_dir}: test score {last['test/score']:.3f} (strict {last['test/strict']:.3f}), "
            f"novel score {last['novel/score']:.3f} (strict {last['novel/strict']:.3f})"
        )
    return 0
