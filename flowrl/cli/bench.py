"""``flowrl bench``, ``flowrl bench-merge`` and ``flowrl bench-leaderboard``: their arguments, and the calls into
:mod:`flowrl.bench`. Light at import time: the harness (and torch) load when a command runs."""

from __future__ import annotations

import argparse
import time

from flowrl.cli.options import ExistingPath, KeyValue, OutputFolder, Seeds, Text, Whole


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
                        help="held-out metric to compare (default: eval/strict, strict accuracy, if logged; else"
                        " eval/score; else the first eval/* key)")
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

    from flowrl.bench.bench_errors import BenchError
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


def configure_merge(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Compare the methods of several bench reports (results.json) as one bench: every comparison computed"
        " anew; more seeds of a method in another report join its earlier ones."
    )
    parser.add_argument("sources", nargs="+", type=Text(), metavar="DIR[:NAME[=NEW],...]",
                        help="bench report folders; after a colon, the methods to take from it (each optionally"
                        " under a new name)")
    parser.add_argument("--reference", required=True, type=Text(), metavar="NAME",
                        help="the method the others are compared with")
    parser.add_argument("--out", required=True, type=OutputFolder(), metavar="DIR",
                        help="folder for the merged results.json, results.md and plots")
    parser.add_argument("--max-nfe", type=Whole(1), default=None, metavar="N",
                        help="compare at this rollout budget: cut longer runs at their first evaluation at or past N")
    parser.set_defaults(func=merge)


def merge(args: argparse.Namespace) -> int:
    """``flowrl bench-merge``: the merged report, written as ``flowrl bench`` writes one."""
    import json
    from pathlib import Path

    from flowrl.bench.merge import merge_reports
    from flowrl.bench.plots import plot_curves
    from flowrl.bench.report import markdown

    merged = merge_reports(args.sources, args.reference, args.max_nfe)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(merged, indent=2, allow_nan=False) + "\n")
    (out / "results.md").write_text(markdown(merged))
    plot_curves(merged, out)
    print(f"wrote {out}/results.md")
    return 0


def configure_leaderboard(parser: argparse.ArgumentParser) -> None:
    parser.description = "Print a bench report's leaderboard: one markdown row per method, best final mean first."
    parser.add_argument("report", type=ExistingPath("folder", "bench report folder"), metavar="DIR",
                        help="a bench report folder (results.json), often one bench-merge wrote")
    parser.add_argument("--labels", default=None, type=Text(), metavar="NAME=LABEL,...",
                        help="the method column's text per recipe name (default: the name)")
    parser.set_defaults(func=leaderboard)


def leaderboard(args: argparse.Namespace) -> int:
    """``flowrl bench-leaderboard``: the table on standard output."""
    import json
    from pathlib import Path

    from flowrl.bench.bench_errors import BenchError
    from flowrl.bench.leaderboard import leaderboard as table

    path = Path(args.report) / "results.json"
    if not path.is_file():
        raise BenchError(f"{path}: no such file (a flowrl bench report folder holds one)")
    labels = dict(item.split("=", 1) for item in (args.labels or "").split(",") if "=" in item)
    print(table(json.loads(path.read_text()), labels), end="")
    return 0
