"""``flowrl suite``: generate, score and compare checkpoints on an evaluation suite; ``flowrl data fetch``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tomllib
from pathlib import Path
from typing import Any

from flowrl.core.errors import UserError


def configure(p: argparse.ArgumentParser) -> None:
    from flowrl.cli.options import Choice, Column, ExistingPath, KeyValue, OutputFolder, Shard, Text, Whole

    sub = p.add_subparsers(dest="suite_command", required=True, metavar="STAGE")
    run = sub.add_parser("run", help="generate and score checkpoints on a suite, then compare them")
    run.add_argument("suite", type=Text(), help="a suite name (flowrl ls suite) or a TOML file: type = NAME and its"
                     " settings")
    run.add_argument("paths", nargs="+", type=Column("any", "run folder, checkpoint folder or recipe"),
                     help="each a column: a recipe (its initial policy), a run folder (its last checkpoint), a"
                     " checkpoint folder (runs/X/checkpoints/best), or RECIPE@LORA: the recipe's base with a LoRA"
                     " trained elsewhere (a diffusers or peft folder, or a .safetensors file)")
    run.add_argument("--out", default=None, type=OutputFolder(), help="results folder: OUT/<tag>/<suite>/ (default:"
                     " RUN/suites for a run folder or one of its checkpoints, where flowrl report finds it)")
    run.add_argument("--tag", action="append", default=[], type=Text(),
                     help="a column's name (one per path; default: the path's)")
    run.add_argument("--stage", default="all", type=Choice("generate", "score", "all"),
                     help="generate, score, or all (default: both, then the comparison)")
    run.add_argument("--shard", default=None, type=Shard(), help="I/N: generate only prompts i with i %% N == I"
                     " (default: the launcher's RANK/WORLD_SIZE)")
    run.add_argument("--prompts", type=Whole(1), default=None, help="only the first N prompts (a subset: not"
                     " comparable with published figures)")
    run.add_argument("--protocol", action="append", default=[], type=KeyValue(), metavar="KEY=VALUE",
                     help="change the pinned protocol (steps, images, seed, shift, guidance, resolution, noise): "
                     "the result is marked not comparable")
    run.add_argument("--set", action="append", default=[], type=KeyValue(), metavar="KEY=VALUE",
                     help="a suite setting (prompts=FILE, detector=URL, ...)")
    run.add_argument("--batch", type=Whole(1), default=64, help="images generated or scored together (default 64,"
                     " as flowrl sample; lower it for a large base)")
    run.add_argument("--quiet", action="store_true", help="no progress bars")
    run.set_defaults(func=run_command)
    cmp = sub.add_parser("compare", help="one table of scored result folders of one suite (the first: baseline)")
    cmp.add_argument("folders", nargs="+", type=ExistingPath("folder", "suite result folder"))
    cmp.add_argument("--out", default=None, type=OutputFolder(),
                     help="write comparison.md/.json/.png here (default: print markdown)")
    cmp.set_defaults(func=compare_command)


def configure_data(p: argparse.ArgumentParser) -> None:
    from flowrl.cli.options import Choice
    from flowrl.suites.data import SOURCES

    sub = p.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    f = sub.add_parser("fetch", help="download a prompt set from its public source (pinned checksum, licence)")
    f.add_argument("name", type=Choice(*SOURCES), help=", ".join(SOURCES))
    f.set_defaults(func=fetch_command)


def fetch_command(args: argparse.Namespace) -> int:
    from flowrl.suites.data import SOURCES, fetch

    path = fetch(args.name)
    print(f"wrote {path} (licence: {SOURCES[args.name][0].licence})")
    return 0


def _value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def build_suite(spec: str, settings: list[str]) -> tuple[str, Any, dict[str, Any]]:
    """The suite's name, the built suite and its settings, from a name or a TOML file plus ``--set`` pairs."""
    from flowrl.core.registry import build

    table: dict[str, Any] = {"type": spec}
    if spec.endswith(".toml"):
        try:
            table = tomllib.loads(Path(spec).read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as error:
            raise UserError(f"{spec}: not a readable TOML suite file ({error})") from None
        if "type" not in table:
            raise UserError(f"{spec}: no 'type' key naming the suite (flowrl ls suite)")
        table["scorers"] = table.pop("scorer", table.get("scorers", ()))
    table.update({key.strip(): _value(value) for key, _, value in (s.partition("=") for s in settings)})
    name = str(table["type"])
    try:
        return name, build("suite", table), {k: v for k, v in table.items() if k != "type"}
    except (TypeError, ValueError) as error:
        raise UserError(f"suite {spec}: {error}") from None


def _shard(given: tuple[int, int] | None) -> tuple[int, int]:
    """``--shard`` as given, else the launcher's ``RANK``/``WORLD_SIZE`` (one process: ``(0, 1)``)."""
    if given is not None:
        return given
    from flowrl.utils.cluster import process_rank

    return process_rank(os.environ)  # checked: a malformed or inconsistent variable is one line naming it


def split_column(text: str) -> tuple[Path, str]:
    """A column's path, and the LoRA of ``RECIPE@LORA`` ("" for none)."""
    recipe, at, lora = text.rpartition("@")
    return (Path(recipe), lora) if at and recipe.endswith(".toml") else (Path(text), "")


def _tag(text: str) -> str:
    path, lora = split_column(text)
    if lora:
        return f"{path.stem}+{Path(lora).stem}"
    if path.suffix == ".toml":
        return f"{path.stem}-initial"
    if path.parent.name == "checkpoints":
        return f"{path.parent.parent.name}-{path.name}"
    return path.name


def default_out(path: Path) -> Path:
    """``RUN/suites`` for a run folder or a checkpoint in one; a recipe has no run folder to keep them."""
    run = path.parent.parent if path.parent.name == "checkpoints" else path
    if path.suffix == ".toml" or not (run / "checkpoints").is_dir():
        raise UserError(f"--out is needed: {path} is not a run folder (results go to RUN/suites by default)")
    return run / "suites"


def policy_for(path: Path, protocol: Any, lora: str = "") -> tuple[Any, Any]:
    """The policy of ``path`` (with the LoRA ``lora`` on a recipe's base) made under ``protocol``, and the protocol
    with the base's own values filled in."""
    import attrs

    from flowrl.config.recipe import load_recipe
    from flowrl.core.types import Schedule
    from flowrl.export.loading import load_policy
    from flowrl.trainer.checkpoints.folder import find_checkpoint

    recipe_file = path if path.suffix == ".toml" else find_checkpoint(path) / "recipe.toml"
    recipe = load_recipe(recipe_file)
    fields = attrs.fields_dict(recipe.parts["backbone"].cls.Config)
    overrides = []
    for key in ("resolution", "guidance"):
        wanted = getattr(protocol, key)
        if wanted is not None:
            if key not in fields:
                raise UserError(f"the protocol sets {key} = {wanted}, but the base of {path} has no {key} setting;"
                                f" run it with --protocol {key}=... matching the base (not comparable)")
            overrides.append(f"backbone.{key}={wanted}")
    warn_if_unlike_training(path, protocol, recipe)
    if lora:
        overrides.append(f"lora.init={json.dumps(str(Path(lora).resolve()))}")
    policy = load_policy(path, overrides)
    shift = protocol.shift if protocol.shift is not None else policy.recipe.schedule.shift
    policy.schedule = Schedule(sigmas=policy.backbone.schedule_sigmas(protocol.steps, shift),
                               kernel=policy.schedule.kernel)
    config = policy.backbone.config
    filled = attrs.evolve(protocol, shift=shift, guidance=getattr(config, "guidance", protocol.guidance),
                          resolution=getattr(config, "resolution", protocol.resolution))
    return policy, filled


def warn_if_unlike_training(path: Path, protocol: Any, recipe: Any) -> None:
    """A protocol far from what the base works at (a 512 px, 40-step protocol on a 32 px model): say so, with how
    much more work an image is, before anything is generated."""
    trained = getattr(recipe.parts["backbone"].config, "resolution", None)
    steps = recipe.schedule.num_steps
    notes = []
    if protocol.resolution is not None and trained and protocol.resolution != trained:
        notes.append(f"{protocol.resolution} px where the base of {path} works at {trained} px")
    if protocol.steps > 2 * steps:
        notes.append(f"{protocol.steps} steps where its recipe samples {steps}")
    if notes:
        scale = protocol.resolution / trained if protocol.resolution and trained else 1.0
        work = scale**2 * protocol.steps / steps
        print(f"warning: the protocol asks {' and '.join(notes)}: each image is about {work:.0f}x the work of one of "
              "its own samples, and the base may never have seen that size; the progress bar gives the time left",
              file=sys.stderr)


def run_command(args: argparse.Namespace) -> int:
    from flowrl.suites import stages
    from flowrl.trainer.writes import check_writable

    name, suite, settings = build_suite(args.suite, args.set)
    pinned = suite.protocol()
    changes = {k.strip(): _value(v) for k, _, v in (p.partition("=") for p in args.protocol)}
    try:
        protocol = pinned.evolve(changes)
    except (KeyError, TypeError, ValueError) as error:
        raise UserError(f"--protocol: {error}") from None
    if args.tag and len(args.tag) != len(args.paths):
        raise UserError(f"--tag given {len(args.tag)} times for {len(args.paths)} paths; give one per path or none")
    tags = args.tag or [_tag(p) for p in args.paths]
    if len(set(tags)) != len(tags):
        raise UserError(f"two columns would share the name {next(t for t in tags if tags.count(t) > 1)!r}; name each"
                        " with --tag")
    shard = _shard(args.shard)
    out = Path(args.out) if args.out else default_out(split_column(args.paths[0])[0])
    if not args.out and shard[0] == 0:  # a given --out was probed with the command line; one process probes
        check_writable(out, "--out")  # before any model loads
    folders = [out / tag / name for tag in tags]
    # what makes the images (run.json; another value is another result) and what scores them (scoring.json)
    scoring = {k: v for k, v in settings.items() if k in suite.scoring}
    images = {k: v for k, v in settings.items() if k not in suite.scoring}
    if args.stage in ("generate", "all"):
        suite.items()  # the prompts are here, before any model loads
        if args.stage == "all" and shard[1] == 1:
            suite.check()  # every scorer's extras, weights or server, before hours of generation
        for column, tag, folder in zip(args.paths, tags, folders, strict=True):
            path, lora = split_column(column)
            policy, used = policy_for(path, protocol, lora)
            print(policy.describe() + (f" with the LoRA {lora}" if lora else ""), file=sys.stderr)
            facts = {"suite": name, "config": images, "protocol": used.to_dict(), "pinned": protocol == pinned,
                     "protocol_changes": changes, "limit": args.prompts, "tag": tag, "checkpoint": str(policy.source),
                     "step": policy.step, "weights_sha256": stages.weights_hash(policy.source, lora),
                     "source": suite.prompt_source()}
            with stages.folder_lock(folder, f"generating shard {shard[0]} of {shard[1]}"):
                made = stages.generate(policy, suite, protocol, folder, facts, shard, args.prompts, args.batch,
                                       args.quiet)
            print(f"{folder}: {made} images made", file=sys.stderr)
    if args.stage == "generate" or (args.stage == "all" and shard[1] > 1):
        return 0  # a shard: the others may still be generating; score once they are done (--stage score)
    for folder in folders:
        with stages.folder_lock(folder, "scoring"):
            summary = stages.score(suite, folder, args.batch, args.quiet, scoring)
        value = summary["figures"].get(summary["headline"]["figure"])
        print(f"{folder}: {summary['headline']['figure']} = {value}", file=sys.stderr)
        if not summary["complete"]:
            print(f"warning: {folder}: {summary['images']} of {summary['expected_images']} images were generated "
                  "(a shard is missing?): the figures cover only those, and the result is not comparable",
                  file=sys.stderr)
    where = out / f"comparison-{name}"
    result = write_comparison(with_earlier(folders, where), where)
    from flowrl.suites.compare import markdown

    print(markdown(result))
    print(f"wrote {where}/comparison.md, .json, .png and .pdf", file=sys.stderr)
    return 0


def with_earlier(folders: list[Path], where: Path) -> list[Path]:
    """``folders`` after the columns of the comparison already in ``where``: a second run adds its columns, and
    the first column stays the baseline (result folders since removed are left out)."""
    earlier = where / "comparison.json"
    try:
        found = json.loads(earlier.read_text()) if earlier.exists() else {}
        before = [Path(f) for table in found.get("tables", []) for f in table.get("folders", [])]
    except (OSError, ValueError, AttributeError, TypeError):
        before = []  # a damaged comparison is written anew
    kept = [f for f in before if (f / "summary.json").exists()]
    return kept + [f for f in folders if f not in kept]


def write_comparison(folders: list[Path], out: Path) -> dict[str, Any]:
    """Compare ``folders`` and write ``comparison.json``, ``.md``, ``.png`` (300 dpi) and ``.pdf`` in ``out`` (the
    first two through a fresh file renamed into place); returns the comparison."""
    from flowrl.suites.compare import compare, markdown, plot
    from flowrl.suites.stages import write_atomically

    result = compare(folders)
    out.mkdir(parents=True, exist_ok=True)
    write_atomically(out / "comparison.json", json.dumps(result, indent=1, allow_nan=True))
    write_atomically(out / "comparison.md", markdown(result))
    plot(result, out / "comparison.png")
    return result


def compare_command(args: argparse.Namespace) -> int:
    from flowrl.suites.compare import compare, markdown

    folders = [Path(f) for f in args.folders]
    # a given --out was probed with the command line (flowrl.cli.options.OutputFolder)
    result = write_comparison(folders, Path(args.out)) if args.out else compare(folders)
    print(markdown(result))
    return 0
