"""``flowrl`` entry point: sub-commands, and the one place user errors become exit status 2."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
from collections.abc import Sequence

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")

from flowrl.cli import commands  # noqa: E402
from flowrl.cli.options import (  # noqa: E402
    SEED_LIMIT,
    Checkpoint,
    Choice,
    ConditionImage,
    ExistingPath,
    KeyValue,
    KindOrPart,
    OneLineParser,
    OutputFile,
    OutputFolder,
    Text,
    Whole,
)
from flowrl.core.errors import PartError  # noqa: E402

CHECKPOINT_HELP = "of a run folder: last (default), best (checkpoints/best) or a step number"
RECIPE, FOLDER = ExistingPath("file", "recipe file"), ExistingPath("folder", "run or checkpoint folder")
ANY_PATH = ExistingPath("any", "run folder, checkpoint folder or recipe")
SEED, COUNT, OVERRIDE = Whole(0, SEED_LIMIT), Whole(1), KeyValue()
PLOT = OutputFile(".png", ".pdf", ".svg", optional=True)


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="flowrl", description="RL fine-tuning of flow-matching text-to-image models.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    t = sub.add_parser("train", help="train from a recipe")
    t.add_argument("recipe", type=RECIPE)
    t.add_argument("--set", action="append", default=[], type=OVERRIDE, metavar="KEY=VALUE",
                   help="override a recipe key")
    t.add_argument("--output-dir", default=None, type=OutputFolder(), help="run folder (default: runs/<name>-<time>)")
    t.add_argument("--resume", default=None, type=FOLDER, help="run folder or checkpoint to continue from")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.set_defaults(func=commands.train)

    v = sub.add_parser("validate", help="check recipes without loading any model")
    v.add_argument("recipes", nargs="+", type=Text())  # a missing file is reported like any other problem
    v.add_argument("--set", action="append", default=[], type=OVERRIDE, metavar="KEY=VALUE",
                   help="override before checking")
    v.set_defaults(func=commands.validate)

    s = sub.add_parser("show", help="print the resolved recipe (defaults filled in)")
    s.add_argument("recipe", type=RECIPE)
    s.add_argument("--set", action="append", default=[], type=OVERRIDE, metavar="KEY=VALUE")
    s.set_defaults(func=commands.show)

    ls = sub.add_parser("ls", help="list registered components, or one part's settings (flowrl ls egrpo_entropy)")
    ls.add_argument("kind", nargs="*", type=KindOrPart(), help="kinds to list (default: all), or parts to describe")
    ls.set_defaults(func=commands.ls)

    e = sub.add_parser("eval", help="score a run or checkpoint on evaluation prompts (deterministic ODE sampling)")
    e.add_argument("path", type=ANY_PATH,
                   help="run folder, checkpoint folder, or a recipe (its initial, untrained policy)")
    e.add_argument("--prompts", type=COUNT, default=None, help="use the first N evaluation prompts (default: all)")
    e.add_argument("--split", default=None, type=Choice("test", "novel", "train"),
                   help="the embedded world's evaluation split: test (default), novel, train")
    e.add_argument(
        "--group-size",
        type=COUNT,
        default=0,
        metavar="G",
        help="also pass@1 and pass@G from G SDE samples per prompt",
    )
    e.add_argument("--set", action="append", default=[], type=OVERRIDE, metavar="KEY=VALUE",
                   help="override a recipe key")
    e.add_argument("--checkpoint", type=Checkpoint(), default="last", help=CHECKPOINT_HELP)
    e.add_argument("--json", action="store_true", help="print one JSON object")
    e.add_argument("--seed", type=SEED, default=0)
    e.set_defaults(func=commands.evaluate)

    sm = sub.add_parser(
        "sample", help="generate a PNG grid (a video model: an animated grid too) with a run's or checkpoint's weights"
    )
    sm.add_argument("path", type=ANY_PATH, help="run folder, checkpoint folder, or a recipe (its initial policy)")
    sm.add_argument("--prompt", action="append", required=True, type=Text(), help="a prompt (repeat for several)")
    sm.add_argument("--image", action="append", default=[], type=ConditionImage(), metavar="PATH",
                    help="an edit base's source image: once for every prompt, or once per --prompt (the i-th --image"
                    " is the i-th prompt's); the grid's first column shows them")
    sm.add_argument("--per-prompt", type=COUNT, default=4, help="images per prompt (default 4)")
    sm.add_argument("--out", default="samples.png", type=OutputFile(".png", ".webp", ".gif"),
                    help="the PNG grid (default samples.png); a video model writes the animated grid (.webp or .gif)"
                    " and the frame grid (.png) beside it")
    sm.add_argument("--set", action="append", default=[], type=OVERRIDE, metavar="KEY=VALUE",
                    help="override a recipe key")
    sm.add_argument("--seed", type=SEED, default=0)
    sm.add_argument("--checkpoint", type=Checkpoint(), default="last", help=CHECKPOINT_HELP)
    sm.set_defaults(func=commands.sample)
    en = sub.add_parser("entropy", help="per-step std and entropy of a recipe's schedule, and its selector's units")
    en.add_argument("recipe", type=RECIPE)
    en.add_argument("--set", action="append", default=[], type=OVERRIDE, metavar="KEY=VALUE")
    en.add_argument("--max-merge", type=COUNT, default=4, help="merge counts to tabulate (1..K)")
    en.add_argument("--plot", type=PLOT, default="", help="also write a PNG of the entropy per step here")
    en.set_defaults(func=commands.entropy)

    pr = sub.add_parser("profile", help="reward spread when one step at a time is stochastic (where RL can act)")
    pr.add_argument("path", type=ANY_PATH, help="a recipe (its initial policy), run folder or checkpoint")
    pr.add_argument("--set", action="append", default=[], type=OVERRIDE, metavar="KEY=VALUE",
                    help="override a recipe key")
    pr.add_argument("--prompts", type=COUNT, default=32, help="training prompts to sample (default 32)")
    pr.add_argument("--group-size", type=COUNT, default=None, metavar="G", help="default: the sampler's")
    pr.add_argument("--json", action="store_true", help="print one JSON object")
    pr.add_argument("--plot", type=PLOT, default="", help="write a PNG of the profile here")
    pr.add_argument("--seed", type=SEED, default=0)
    pr.set_defaults(func=commands.profile)

    rp = sub.add_parser("report", help="write a one-page HTML report of a run: curves, alerts, samples, recipe")
    rp.add_argument("run", type=ExistingPath("folder", "run folder"), help="run folder")
    rp.add_argument("--out", default=None, type=OutputFile(".html"), metavar="FILE.html",
                    help="where to write it (default: RUN/report.html)")
    rp.add_argument("--suites", default=None, type=ExistingPath("folder", "suite results folder"), metavar="DIR",
                    help="the --out folder of flowrl suite run whose comparisons to show (default: RUN/suites)")
    rp.set_defaults(func=commands.report)

    from flowrl.cli.bench import configure as configure_bench
    from flowrl.cli.bench import configure_leaderboard, configure_merge
    from flowrl.cli.export import configure as configure_export
    from flowrl.cli.launch import configure as configure_launch
    from flowrl.cli.pretrain import configure as configure_pretrain
    from flowrl.cli.serve import configure as configure_serve
    from flowrl.cli.suite import configure as configure_suite
    from flowrl.cli.suite import configure_data

    configure_pretrain(sub.add_parser("pretrain", help="pre-train the embedded world's base model by flow matching"))
    configure_bench(sub.add_parser("bench", help="run recipes x seeds on the embedded benchmark; write a report"))
    configure_merge(sub.add_parser("bench-merge", help="compare the methods of several bench reports as one bench"))
    configure_leaderboard(sub.add_parser("bench-leaderboard", help="a bench report's leaderboard table (markdown)"))
    configure_launch(sub.add_parser("launch", help="run a flowrl command on every process of this node"))
    configure_export(sub.add_parser("export", help="a checkpoint as a folder to hand on (weights, samples, card)"))
    configure_serve(sub.add_parser("serve", help="serve a reward over HTTP (for [[reward]] type = \"remote\")"))
    configure_suite(sub.add_parser("suite", help="evaluation suites (GenEval, HPSv2, ...): generate, score, compare"))
    configure_data(sub.add_parser("data", help="fetch a suite's prompt set from its public source"))
    return p


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parser().parse_args(argv)
    except SystemExit as stop:  # a refused option (one line already printed, status 2) or --help (0)
        return int(stop.code or 0) if not isinstance(stop.code, str) else 2
    # Research code next to a recipe is importable as `module:Class` without installing it.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # the reader went away (`flowrl ls | head`): nothing more to say, and no traceback
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except commands.USER_ERRORS as error:
        cause = error.__cause__
        if isinstance(error, PartError) and cause is not None and not isinstance(cause, commands.USER_ERRORS):
            # a user-written part raised: its traceback is where the bug is, then the line naming the part
            traceback.print_exception(type(cause), cause, cause.__traceback__, file=sys.stderr)
        message = error.report() if hasattr(error, "report") else str(error)
        print(message if message.startswith(("recipe error", "error")) else f"error: {message}", file=sys.stderr)
        return 2
    except OSError as error:  # a write the file system refused (full, read-only, quota) in any command: one line
        from flowrl.trainer.writes import REFUSALS, refused

        found = refused(error, Path(error.filename or "."), "free space or choose another folder, then run the command"
                        " again") if error.errno in REFUSALS else None
        if found is None:
            raise
        print(f"error: {found}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as interrupt:  # 128 + the signal number, as a shell reports it
        print("interrupted", file=sys.stderr)
        return {"SIGTERM": 143, "SIGHUP": 129}.get(getattr(interrupt, "signal", ""), 130)


if __name__ == "__main__":
    sys.exit(main())
