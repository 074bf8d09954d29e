"""``flowrl bench`` arguments. Light at import time: the harness (and torch) load when the command runs."""

from __future__ import annotations

import argparse
import time

from flowrl.option_kinds import ExistingPath, KeyValue, OutputFolder, Seeds, Text, Whole


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Train each recipe with each seed under the same rollout NFE budget (in this process, one after"
        " another) and write results.json, results.md and score-vs-NFE / score-vs-wall-time plots."
    )
    parser.add_argument("recipes", nargs="+", type=ExistingPath("file"), metavar="RECIPE",
                        help="recipe files; each needs held-out prompts")
    parser.add_argument("--seeds", default="0,1,2", type=Seeds(), help="comma-separated seeds (default: 0,1,2)")
    parser.add_argument("--nfe-budget", type=Whole(1), required=True, metavar="N",
                        help="stop each run once its rollouts used N transformer evaluations (trainer.max_nfe)")
    parser.add_argument("--eval-every", type=Whole(0), default=None, metavar="K",
                        help="held-out evaluation every K iterations (default: 5, or none with --eval-every-nfe)")
    parser.add_argument("--eval-every-nfe", type=Whole(0), default=None, metavar="N",
                        help="held-out evaluation each time a run's rollouts pass a multiple of N NFE: every method"
                        " evaluated at the same budgets (trainer.eval_every_nfe)")
    parser.add_argument("--eval-prompts", type=Whole(1), default=None, metavar="M",
                        help="held-out prompts per evaluation (default: the recipe's trainer.eval_prompts)")
    parser.add_argument("--metric", default=None, type=Text("eval/"),
                        help="held-out metric to compare (default: eval/score if logged, else the first eval/* key)")
    parser.add_argument("--reference", default=None, type=Text(), metavar="NAME",
                        help="recipe name the others are compared with (default: the first recipe's)")
    parser.add_argument("--set", action="append", default=[], type=KeyValue(), metavar="KEY=VALUE",
                        help="override a key in every recipe (repeatable)")
    parser.add_argument("--output-dir", default=None, type=OutputFolder(), metavar="DIR",
                        help="report folder; runs go to DIR/runs/<name>/seed<k> (default: runs/bench-<time>)")
    parser.add_argument("--resume", action="store_true",
                        help="reuse runs in DIR finished with the same resolved recipe (alert thresholds aside),"
                        " continue interrupted ones from their checkpoint, extend runs with a smaller --nfe-budget to"
                        " this one (needs --output-dir)")
    parser.add_argument("--quiet", action="store_true", help="no per-run training bars (the bar over runs stays)")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """``flowrl bench``; its BenchError is a UserError: one line and exit status 2 (flowrl.cli.main)."""
    from pathlib import Path

    from flowrl.bench.errors import BenchError
    from flowrl.bench.report import markdown
    from flowrl.bench.run import parse_seeds, run_bench

    if args.resume and args.output_dir is None:
        raise BenchError("--resume needs --output-dir (the bench folder whose runs to reuse)")
    seeds = parse_seeds(args.seeds)
    out = Path(args.output_dir or f"runs/bench-{time.strftime('%Y%m%d-%H%M%S')}")
    results = run_bench(
        args.recipes, seeds, args.nfe_budget, out,
        eval_every=args.eval_every, eval_every_nfe=args.eval_every_nfe, eval_prompts=args.eval_prompts,
        overrides=args.set,
        reference=args.reference, metric=args.metric, resume=args.resume, quiet=args.quiet,
    )
    print(markdown(results), end="")
    for key, verb in (("reused", "reused finished run(s)"), ("continued", "continued interrupted run(s)"),
                      ("extended", "extended run(s) to the new budget")):
        if results["bench"].get(key):
            print(f"{verb}: {', '.join(results['bench'][key])}")
    print(f"report: {out / 'results.md'} (results.json, score_vs_nfe.png, score_vs_wall_s.png)")
    return 0
