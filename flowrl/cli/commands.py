"""The sub-commands. Each takes parsed arguments and returns an exit status."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from flowrl.config.recipe import RecipeError, load_recipe
from flowrl.core.conditions import Prompt, conditions_of
from flowrl.core.errors import UserError
from flowrl.core.registry import KINDS, registry, summary
from flowrl.trainer.checkpoints.folder import CheckpointError, find_checkpoint

if TYPE_CHECKING:
    from torch import Tensor

    from flowrl.config.recipe import Recipe
    from flowrl.core.conditions import Condition

USER_ERRORS = (UserError, FileNotFoundError)  # one line on stderr, exit status 2 (flowrl.core.errors)


def train(args: argparse.Namespace) -> int:
    from flowrl.trainer import train as run_training
    from flowrl.trainer.runfolder import RunFolder
    from flowrl.trainer.summary import run_summary
    from flowrl.utils.cluster import process_rank

    own: list[str] = []
    if args.resume:  # fail before any folder is created or written, and before any model loads
        try:
            checkpoint = find_checkpoint(Path(args.resume), exported=False)  # an export has no trainer state
        except CheckpointError as error:
            raise CheckpointError(f"--resume {error}") from None
        from flowrl.trainer.lora import own_lora

        own = own_lora(checkpoint, Path(args.recipe))  # a moved run resumes without the LoRA file it started from
    recipe = load_recipe(args.recipe, [*own, *args.set])
    folder = RunFolder.for_training(recipe.name, args.output_dir, args.resume)
    main_process = process_rank(os.environ)[0] == 0  # checked: a malformed variable is one line naming it
    folder.check(probe=main_process)  # before the model loads: it can be made and written
    with folder.refused_writes():  # a write refused anywhere in the run: one line naming the file
        out = run_training(recipe, folder, resume=Path(args.resume) if args.resume else None, quiet=args.quiet)
    if main_process:
        print(run_summary(out, recipe.trainer.keep_best, recipe))
    return 0


def validate(args: argparse.Namespace) -> int:
    from flowrl.backbones.lora.targets import lora_target_problems
    from flowrl.config.condition_checks import reward_condition_problems
    from flowrl.rewards.remote import server_problems
    from flowrl.trainer.trackers import tracker_problems

    failed = 0
    for path in args.recipes:
        try:
            recipe = load_recipe(path, args.set)
            problems = list(lora_target_problems(recipe))  # what building the model would refuse, without weights
            problems += server_problems(recipe)  # a served reward's server must answer
            problems += reward_condition_problems(recipe)  # a reward that reads the source needs prompts with one
            problems += tracker_problems(recipe.trainer.loggers)  # a tracker's package must be there
            if problems:
                raise RecipeError(recipe.source, problems)
            print(f"ok  {path}")
        except RecipeError as error:
            failed += 1
            print(error.report())
    return 2 if failed else 0


def show(args: argparse.Namespace) -> int:
    print(load_recipe(args.recipe, args.set).to_toml(), end="")
    return 0


def ls(args: argparse.Namespace) -> int:
    from flowrl.config.part_docs import part_text

    kinds = [k for k in args.kind if k in KINDS] or ([] if args.kind else list(KINDS))
    for name in (n for n in args.kind if n not in KINDS):  # a part's name: its settings (every kind using it)
        for kind in (k for k in KINDS if name in registry(k).names()):
            print(part_text(kind, name, registry(kind).get(name)) + "\n")
    for kind in kinds:
        reg = registry(kind)
        print(f"{kind}:")
        items = reg.items()
        width = max((len(name) for name, _ in items), default=0)
        for name, cls in items:
            print(f"  {name:<{width}}  {summary(cls)}")
    return 0


def entropy(args: argparse.Namespace) -> int:
    import torch

    from flowrl.core.schedule import shifted_sigmas
    from flowrl.core.types import Schedule
    from flowrl.parts.entropy import entropy_table, format_table, plot_entropy
    from flowrl.parts.selectors import iteration_plan

    recipe = load_recipe(args.recipe, args.set)
    grid = recipe.schedule
    sigmas = tuple(float(s) for s in shifted_sigmas(grid.num_steps, grid.shift))
    backbone_grid = getattr(recipe.parts["backbone"].config, "grid", "uniform")
    on_grid = f"shift = {grid.shift}"
    if backbone_grid != "uniform":  # the pipeline's own grid (a dynamic shift): the model's config gives it
        try:
            sigmas = tuple(float(s) for s in recipe.build("backbone").schedule_sigmas(grid.num_steps, grid.shift))
            on_grid = f"grid: the backbone's ({backbone_grid}), as training samples it; schedule.shift is not used"
        except OSError:  # the model is not on this machine: say which grid the table is of
            on_grid = (f"grid: flowrl's shifted grid (shift {grid.shift}), not the backbone's '{backbone_grid}' one,"
                       " which needs the model's files on this machine")
    schedule = Schedule(sigmas, recipe.build("kernel"))
    generator, selector = torch.Generator().manual_seed(recipe.seed), recipe.parts["selector"].type
    chosen = iteration_plan(recipe.build("selector"), schedule, 0, generator, True, selector)
    plan = chosen if grid.final_sde else chosen.finish_by_ode(grid.num_steps)
    units = [(u.start, u.merge) for u in plan.units]
    rows = entropy_table(schedule, max(1, args.max_merge))
    kernel = recipe.parts["kernel"]
    print(f"{recipe.name}: {kernel.type} {kernel.to_table()}, N = {grid.num_steps}, {on_grid}")
    print("h_mK: per-dimension entropy (nats) of one jump from this step over K steps")
    print(format_table(rows))
    print(f"units (start, merge) chosen by the selector at iteration 0: {units}")
    if len(plan.units) < len(chosen.units):
        last = chosen.units[-1]
        print(f"  (the selector chose {len(chosen.units)}; its last, ({last.start}, {last.merge}), ends at noise"
              " level 0 untrained, so that step is an ODE step: schedule.final_sde = false)")
    print(f"trained: {[units[k] for k in plan.trained]}")
    if args.plot:
        title = f"{recipe.name}: entropy per timestep ({kernel.type})"
        plot_entropy(rows, Path(args.plot), units, title)
        print(f"wrote {args.plot}")
    return 0


def evaluate(args: argparse.Namespace) -> int:
    from flowrl.export.loading import load_policy

    overrides = list(args.set)
    if args.split:
        overrides.append(f"prompts.eval_split={args.split}")
    try:
        loaded = load_policy(Path(args.path), overrides, args.checkpoint)
    except RecipeError as error:
        if args.split and any(key.startswith("prompts.eval_split") and "unknown key" in why
                              for key, why in error.problems):
            raise UserError(f"--split applies to the embedded world's prompts ([prompts] type = \"world\");"
                             f" the prompts of {args.path} have no splits") from None
        raise
    print(loaded.describe(), file=sys.stderr)
    result = loaded.evaluate(limit=args.prompts, seed=args.seed, group=args.group_size)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>12}: {value}")
    return 0


def sample(args: argparse.Namespace) -> int:
    from flowrl.export.loading import load_policy
    from flowrl.trainer.logger import save_grid_animation, save_grid_png
    from flowrl.utils.video import ANIMATION_SUFFIXES, is_clip

    given = list(args.image or [])
    if given and len(given) not in (1, len(args.prompt)):
        raise UserError(f"--image: given {len(given)} times for {len(args.prompt)} --prompt; give one --image for"
                        " every prompt, or one per --prompt (the i-th --image is the i-th prompt's source)")
    sources = given * len(args.prompt) if len(given) == 1 else given  # one for all, or the i-th for the i-th
    asked = [Prompt(text, [sources[i]] if given else []) for i, text in enumerate(args.prompt)]
    loaded = load_policy(Path(args.path), args.set, args.checkpoint, lambda r: _check_images(r, asked, given))
    print(loaded.describe(), file=sys.stderr)
    prompts = [p for p in asked for _ in range(args.per_prompt)]
    images = loaded.images(prompts, seed=args.seed)
    if given:  # a column of sources first, then each prompt's results: one sees the edit
        images = _with_sources(images, asked, args.per_prompt)
    out, rows = Path(args.out), len(args.prompt)
    what = "; the first column: each prompt's --image" if given else ""
    if not is_clip(images):
        if out.suffix.lower() != ".png":
            raise UserError(f"--out {args.out}: this model makes images; write them as a .png grid")
        save_grid_png(images, rows=rows, path=out)
        print(f"wrote {args.out} ({len(prompts)} images{what})")
        return 0
    # a video base: the animated grid (.webp unless .gif was asked for) and the frame grid (.png) beside it
    animated = out if out.suffix.lower() in ANIMATION_SUFFIXES else out.with_suffix(".webp")
    save_grid_animation(images, rows=rows, path=animated)
    save_grid_png(images, rows=rows, path=animated.with_suffix(".png"))
    frames = images.shape[1]
    print(f"wrote {animated} and {animated.with_suffix('.png')} ({len(prompts)} clips of {frames} frames{what})")
    return 0


def _check_images(recipe: Recipe, prompts: list[str], given: list[Condition]) -> None:
    """``flowrl sample``'s prompts (with their ``--image``) held to what the recipe's backbone takes, before the
    model loads: an edit base needs ``--image``, a text-to-image base takes none."""
    from flowrl.core.conditions import check_conditions

    part = recipe.parts["backbone"]
    spec = part.cls.accepts(part.config)
    if given and spec.count[1] == 0:
        raise UserError(f"--image: the backbone '{part.type}' takes {spec.describe()}; leave out --image")
    if not given and spec.count[0] > 0:
        raise UserError(f"--image: the backbone '{part.type}' takes {spec.describe()} with each prompt; give it"
                        " with --image PATH (one for every prompt, or one per --prompt)")
    check_conditions((("--image:", p) for p in prompts), spec, part.type)


def _with_sources(images: Tensor, prompts: list[str], per_prompt: int) -> Tensor:
    """``images`` (``per_prompt`` a prompt, prompt after prompt) with each prompt's first condition image before
    its results, fitted to their size (scaled and centre-cropped; a clip's source repeated over its frames)."""
    import numpy as np
    import torch
    from PIL import Image, ImageOps

    height, width = images.shape[-2:]
    out = []
    for i, prompt in enumerate(prompts):
        condition = conditions_of(prompt)[0]
        pixels = condition.pixels if condition.mode != "L" else condition.pixels[:, :, 0]
        image = ImageOps.fit(Image.fromarray(pixels, condition.mode).convert("RGB"), (width, height),
                             Image.Resampling.BICUBIC)
        tile = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0).permute(2, 0, 1)
        results = images[i * per_prompt:(i + 1) * per_prompt]
        out += [tile.expand_as(results[0]).to(results), *results]
    return torch.stack(out)


def profile(args: argparse.Namespace) -> int:
    import torch
    from tqdm import tqdm

    from flowrl.core.types import Schedule
    from flowrl.evaluation.profile import format_profile, front_to_back, plot_profile, reward_profile
    from flowrl.export.loading import load_policy

    loaded = load_policy(Path(args.path), args.set)
    grid = loaded.recipe.schedule
    schedule = Schedule(loaded.backbone.schedule_sigmas(grid.num_steps, grid.shift), loaded.recipe.build("kernel"))
    group = args.group_size or int(getattr(loaded.recipe.parts["sampler"].config, "group_size", 8))
    prompts = loaded.prompts.sample(args.prompts, torch.Generator().manual_seed(args.seed))
    with tqdm(total=schedule.num_steps, desc="profile", disable=args.json, leave=False) as bar:
        rows = reward_profile(loaded.backbone, prompts, loaded.rewards, schedule, group, args.seed, bar)
    ratio = front_to_back(rows)
    if args.json:
        print(json.dumps({"prompts": len(prompts), "group_size": group, "front_to_back": ratio, "steps": rows}))
    else:
        kernel = loaded.recipe.parts["kernel"]
        print(f"{loaded.recipe.name}: {kernel.type} {kernel.to_table()}, N = {schedule.num_steps}, G = {group}")
        print("spread: within-group std of the final reward when only this step is SDE (shared initial noise)")
        print(format_profile(rows))
        print(f"first third / last third of the steps: {ratio:.2f}x the reward spread")
    if args.plot:
        plot_profile(rows, Path(args.plot), f"{loaded.recipe.name}: reward spread per perturbed step")
        if not args.json:
            print(f"wrote {args.plot}")
    return 0


def report(args: argparse.Namespace) -> int:
    from flowrl.report.page import write_report

    out = write_report(Path(args.run), Path(args.out) if args.out else None, Path(args.suites) if args.suites else None)
    print(f"wrote {out} (and every panel as PNG and PDF in {out.with_name(out.stem + '_figures')})")
    return 0
