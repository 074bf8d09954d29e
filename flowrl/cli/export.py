"""``flowrl export RUN --out DIR``: one checkpoint as a folder to hand on (weights, recipe, samples, model card),
optionally uploaded with ``--push-to-hub OWNER/NAME``. Light at import time: the model loads when it runs."""

from __future__ import annotations

import argparse

from flowrl.cli.options import Checkpoint, ExistingPath, OutputFolder, Text, Whole

CHECKPOINT_HELP = "which checkpoint of a run folder: last (default), best, or a step number"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Write one checkpoint as a folder a colleague or a model hub can take: the diffusers LoRA folder and the"
        " kohya file (a LoRA run) or the trained transformer, the base pipeline when the run read it from a local"
        " folder (base/), the resolved recipe without this machine's paths, a sample grid and a model card"
        " (README.md) with the run's held-out figures and code that loads the folder. flowrl sample and flowrl"
        " eval take the folder as they take a checkpoint."
    )
    parser.add_argument("run", type=ExistingPath("folder", "run or checkpoint folder"), metavar="RUN",
                        help="a run folder or one checkpoint folder")
    parser.add_argument("--out", required=True, type=OutputFolder(), metavar="DIR",
                        help="the folder to write (new, or empty)")
    parser.add_argument("--checkpoint", type=Checkpoint(), default="last", help=CHECKPOINT_HELP)
    parser.add_argument("--full-weights", action="store_true",
                        help="a LoRA run: also write the transformer with the LoRA merged in (transformer/); a full"
                        " fine-tune has nothing to merge (said on stderr; its transformer/ is written anyway)")
    parser.add_argument("--prompt", action="append", default=[], type=Text(), metavar="TEXT",
                        help="a row of the sample grid (repeatable; default: the first 4 held-out prompts)")
    parser.add_argument("--per-prompt", type=Whole(0), default=4, metavar="N",
                        help="samples per prompt in the grid (default 4; 0: no grid)")
    parser.add_argument("--push-to-hub", default=None, type=Text(), metavar="OWNER/NAME",
                        help="then upload the folder to this model repository (needs a token and the network)")
    parser.add_argument("--private", action="store_true", help="with --push-to-hub: create the repository private")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """``flowrl export``: the folder, then the upload when asked."""
    import sys
    from pathlib import Path

    from flowrl.export.folder import export_checkpoint
    from flowrl.export.hub import push_folder, ready

    if args.push_to_hub is not None:
        ready(args.push_to_hub, Path(args.out))  # the id, offline mode and the token, before the model loads
    from flowrl.trainer.writes import refused_writes

    with refused_writes(Path(args.out), "free space or choose another --out, then export again"):
        out = export_checkpoint(Path(args.run), Path(args.out), args.checkpoint, args.full_weights, args.prompt,
                                args.per_prompt)
    print(f"wrote {out}: " + ", ".join(sorted(p.name for p in out.iterdir())))
    if args.push_to_hub is not None:
        print(f"uploading {out} to {args.push_to_hub} ...", file=sys.stderr)
        print(f"uploaded: {push_folder(out, args.push_to_hub, args.private)}")
    return 0
