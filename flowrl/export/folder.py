"""Writing the hand-on folder of one checkpoint (``flowrl export``).

The folder is assembled beside ``out`` under a hidden name and renamed into place once complete, so an export
that fails (a full disk, a model that cannot be merged) leaves nothing half-written; an ``out`` that exists and
holds files is refused, never overwritten.

What the card's code needs is in the folder or named by a hub id: a base given as a local folder is copied into
``base/`` (another machine has no such folder), a base named by a hub id (or a folder of the hub cache) is
named by its id, and flowrl's own models (the embedded world's, the ``tiny_*`` twins) need only flowrl.
``flowrl_export.json`` (:mod:`~flowrl.trainer.checkpoints.manifest`) lets flowrl load the folder again, and no file
keeps a path of this machine (:mod:`~flowrl.export.scrub`).
"""

from __future__ import annotations

import re
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from flowrl.core.errors import UserError
from flowrl.export.card import CardFacts, Figure, model_card
from flowrl.export.conditions import source_files, takes
from flowrl.export.scrub import hub_id_of_cache_folder, leaks, machine_paths, portable_recipe, scrub_configs
from flowrl.trainer.checkpoints.manifest import BASE_FOLDER, Manifest, is_exported
from flowrl.trainer.runfolder import read_metrics

SAMPLE_PROMPTS = 4  # grid rows when no --prompt is given: the first held-out prompts
BUILT_IN_LICENCE = "apache-2.0"  # flowrl's own licence, which its built-in and tiny models are under
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class ExportError(UserError):
    """An export that cannot be made as asked: one line, exit status 2."""


def run_folder_of(checkpoint: Path) -> Path | None:
    """The run folder holding ``checkpoint`` (``RUN/checkpoints/<name>``), or None for a checkpoint moved out."""
    parent = checkpoint.parent
    return parent.parent if parent.name == "checkpoints" else None


def _front_matter_licence(readme: Path) -> str | None:
    """The ``license:`` of a model card's YAML front matter."""
    try:
        text = readme.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if not text.startswith("---"):
        return None
    for line in text.split("---", 2)[1].splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "license" and value.strip():
            return value.strip().strip("'\"")
    return None


def base_licence(backbone_type: str, base: str) -> tuple[str, str]:
    """(licence, a sentence on where it comes from) for the base model: flowrl's own for its built-in models, the
    base's model card where one is on this machine (a local folder's README.md, or the hub cache's), else
    "other" with a pointer to the base's page."""
    if backbone_type in ("world_tiny", "world_edit_tiny") or backbone_type.startswith("tiny_"):
        return BUILT_IN_LICENCE, (f"`{backbone_type}` is one of flowrl's own models (built or pre-trained by flowrl's"
                                  " code), under flowrl's licence, Apache-2.0; so is this folder.")
    readme: Path | None = Path(base) / "README.md" if Path(base).is_dir() else None
    if readme is None and HUB_ID.match(base):
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(base, "README.md")
            readme = Path(cached) if isinstance(cached, str) else None
        except Exception:  # no cache, or an id the hub library refuses: the licence stays unknown
            readme = None
    found = _front_matter_licence(readme) if readme is not None else None
    if found:
        return found, (f"These weights derive from `{base}`, whose model card gives the licence `{found}`; its terms"
                       " apply to them. Read them on the base's page before you share or use the weights.")
    return "other", (f"These weights derive from `{base}`, and its licence applies to them; flowrl found no licence in"
                     " the base's files on this machine, so read it on the base's page before you share them.")


def _figures(run: Path | None, step: int) -> tuple[Figure, ...]:
    """Every top-level held-out figure with its standard error, at step 0 and at ``step``."""
    rows = read_metrics(run / "metrics.jsonl") if run is not None and (run / "metrics.jsonl").is_file() else []
    evals = {int(r["step"]): r for r in rows if any(k.startswith("eval/") for k in r)}
    if not evals:
        return ()
    names = [k for row in evals.values() for k, v in row.items()
             if k.startswith("eval/") and k.count("/") == 1 and not k.endswith("_se") and isinstance(v, int | float)]
    names = list(dict.fromkeys(names))

    def at(row: dict[str, Any] | None, key: str) -> tuple[float, float] | None:
        if row is None or not isinstance(row.get(key), int | float):
            return None
        se = row.get(f"{key}_se")
        return float(row[key]), float(se) if isinstance(se, int | float) else float("nan")

    return tuple(Figure(k, at(evals.get(0), k), at(evals.get(step), k)) for k in names)


def _suites(run: Path | None) -> tuple[str, ...]:
    if run is None:
        return ()
    return tuple(p.read_text(encoding="utf-8") for p in sorted((run / "suites").glob("comparison-*/comparison.md")))


def _write_weights(loaded: Any, staging: Path, full_weights: bool) -> None:
    from flowrl.backbones.lora.export import export_lora

    transformer = loaded.backbone.transformer
    if loaded.recipe.lora is not None:
        if export_lora(loaded.backbone, staging / "lora") is None:
            raise ExportError(f"the backbone '{loaded.recipe.parts['backbone'].type}' has no diffusers pipeline to"
                              " write a LoRA folder with")
        if not full_weights:
            return
        transformer.fuse_lora()  # the adapters' product into the base weights (scale alpha / rank), then off
        transformer.unload_lora()
    if not hasattr(transformer, "save_pretrained"):
        raise ExportError(f"the transformer of '{loaded.recipe.parts['backbone'].type}' is no diffusers model;"
                          " it cannot be written as a transformer folder")
    transformer.save_pretrained(staging / "transformer", safe_serialization=True)


def _write_samples(loaded: Any, staging: Path, prompts: Sequence[str], per_prompt: int) -> str:
    """The sample grid, a row per prompt; where the prompts carry condition images (an edit's source), each row
    starts with its prompt's source (:func:`~flowrl.export.conditions.with_sources`)."""
    from flowrl.core.conditions import conditions_of
    from flowrl.export.conditions import with_sources
    from flowrl.trainer.logger import save_grid_animation, save_grid_png
    from flowrl.utils.video import is_clip

    images = loaded.images([p for p in prompts for _ in range(per_prompt)], seed=0)
    if any(conditions_of(p) for p in prompts):
        images = with_sources(images, prompts, per_prompt)
    if not is_clip(images):
        save_grid_png(images, rows=len(prompts), path=staging / "samples.png")
        return "samples.png"
    save_grid_animation(images, rows=len(prompts), path=staging / "samples.webp")
    save_grid_png(images, rows=len(prompts), path=staging / "samples.png")
    return "samples.webp"


@attrs.frozen
class Base:
    """Where the exported weights' base model comes from, for the card, the recipe and the folder."""

    kind: str  # "hub": a hub id; "folder": a local folder, shipped as base/; "flowrl": built or shipped by flowrl
    ref: str  # the hub id, the local folder, or the backbone's name
    shown: str  # how the card names it

    @property
    def recipe_path(self) -> str:
        """``backbone.path`` in the exported recipe ("" keeps the recipe's)."""
        return {"hub": self.ref, "folder": BASE_FOLDER}.get(self.kind, "")


def base_of(backbone_type: str, config: Any) -> Base:
    """Classify the run's base from its backbone settings."""
    path = str(getattr(config, "path", "") or "")
    if not path:
        return Base("flowrl", backbone_type, backbone_type)
    if Path(path).exists():
        hub = hub_id_of_cache_folder(path)
        if hub:
            return Base("hub", hub, hub)
        return Base("folder", path, Path(path).resolve().name)
    return Base("hub", path, path) if HUB_ID.match(path) else Base("folder", path, Path(path).name)


def _generation_settings(loaded: Any) -> tuple[tuple[str, Any], ...]:
    """The pipeline call's keyword arguments that give flowrl's evaluation settings, where the call takes them."""
    import inspect

    params = inspect.signature(type(loaded.backbone.pipe).__call__).parameters
    c = loaded.backbone.config
    side = getattr(c, "resolution", None)
    wanted: dict[str, Any] = {"height": getattr(c, "height", 0) or side, "width": getattr(c, "width", 0) or side,
                              "num_frames": getattr(c, "num_frames", None),
                              "num_inference_steps": loaded.recipe.trainer.eval_steps}
    for field, arg in (("guidance", "guidance_scale"), ("guidance_scale", "guidance_scale"),
                       ("true_cfg_scale", "true_cfg_scale"), ("negative_prompt", "negative_prompt"),
                       ("max_sequence_length", "max_sequence_length")):
        value = getattr(c, field, None)
        if value is not None and value != "":
            wanted[arg] = value
    return tuple((k, v) for k, v in wanted.items() if v is not None and k in params)


def _loader(loaded: Any, base: Base) -> tuple[str, str]:
    """("diffusers", "") where a diffusers pipeline loads the exported weights, else ("flowrl", why not)."""
    name = loaded.recipe.parts["backbone"].type
    if not hasattr(type(getattr(loaded.backbone, "pipe", None)), "from_pretrained"):
        return "flowrl", f"the backbone `{name}` is no diffusers pipeline."
    if getattr(loaded.backbone, "pixel_space", False):
        pipeline = type(loaded.backbone.pipe).__name__
        return "flowrl", (f"`{name}` works on pixels, with no VAE, and a diffusers `{pipeline}` decodes only through"
                          " one (flowrl packs and unpacks the pixels itself).")
    if base.kind == "flowrl":
        return "flowrl", f"`{name}` is built by flowrl's code from the recipe, not loaded from a hub id or a folder."
    return "diffusers", ""


def _copy_base(base: Base, staging: Path) -> None:
    """The base's folder into ``base/`` (hidden files, such as a download's cache records, left out)."""
    shutil.copytree(Path(base.ref), staging / BASE_FOLDER, ignore=shutil.ignore_patterns(".*"))


def _example(loaded: Any, rows: Sequence[str]) -> str:
    """The prompt of the card's example: the first sample row, else the first held-out prompt; for a base that
    takes condition images, the first of those with some (the example passes its source with ``--image``)."""
    from flowrl.core.conditions import conditions_of

    candidates = [*rows, *(loaded.prompts.heldout() or [])] or ["a photo"]
    if takes(loaded.recipe.parts["backbone"]).count[1]:
        return next((p for p in candidates if conditions_of(p)), candidates[0])
    return candidates[0]


def _facts(loaded: Any, run: Path | None, base: Base, source: Path, rows: Sequence[str], sample_file: str,
           full_weights: bool, licence: tuple[str, str], example: str,
           sources: tuple[tuple[tuple[str, ...], ...], tuple[str, ...]]) -> CardFacts:
    recipe = loaded.recipe
    last = read_metrics(run / "metrics.jsonl")[-1] if run is not None and (run / "metrics.jsonl").is_file() else {}
    loader, why = _loader(loaded, base)
    return CardFacts(
        name=recipe.name, base=base.shown, base_is_hub_id=base.kind == "hub", licence=licence[0],
        licence_note=licence[1],
        parts={kind: recipe.parts[kind].type for kind in ("selector", "sampler", "kernel", "advantage", "loss")},
        rewards=tuple((r.name or r.type, r.weight) for r in recipe.rewards),
        step=loaded.step, iterations=int(last.get("step", loaded.step)), nfe=int(last.get("nfe", 0)),
        eval_steps=recipe.trainer.eval_steps, figures=_figures(run, loaded.step),
        lora=recipe.lora is not None, full_weights=full_weights and recipe.lora is not None,
        pipeline_class=type(getattr(loaded.backbone, "pipe", None)).__name__,
        transformer_class=type(loaded.backbone.transformer).__name__,
        video=sample_file.endswith(".webp") or hasattr(loaded.backbone.config, "num_frames"),
        sample_prompts=tuple(rows) if sample_file else (), sample_file=sample_file, suites=_suites(run),
        checkpoint=source.name, loader=loader, base_ref=base.recipe_path, not_diffusers=why,
        torch_dtype=str(getattr(loaded.backbone.config, "dtype", "") or ""),
        call=_generation_settings(loaded) if loader == "diffusers" else (),
        example_prompt=str(example), takes=takes(recipe.parts["backbone"]),
        sample_sources=sources[0], example_images=sources[1],
    )


def export_checkpoint(
    path: Path, out: Path, checkpoint: str = "last", full_weights: bool = False,
    prompts: Sequence[str] = (), per_prompt: int = 4,
) -> Path:
    """Write the hand-on folder of a run's (or a checkpoint folder's) checkpoint into ``out``; returns ``out``.
    ``prompts``: the sample grid's rows (default: the first held-out prompts; none: no grid when
    ``per_prompt`` is 0). ``full_weights`` on a full fine-tune: nothing to merge, said on stderr."""
    from flowrl.export.loading import load_policy

    path, out = Path(path), Path(out)
    if path.suffix == ".toml":
        raise ExportError(f"{path}: export takes a run or checkpoint folder (a recipe has no trained weights)")
    if is_exported(path):
        raise ExportError(f"{path}: already an exported folder; export from the run folder it came from")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"--out {out}: exists and is not empty; choose a new folder (nothing is overwritten)")
    loaded = load_policy(path, checkpoint=checkpoint)
    source = Path(loaded.source)
    run = run_folder_of(source)
    backbone_config = loaded.recipe.parts["backbone"]
    base = base_of(backbone_config.type, backbone_config.config)
    if full_weights and loaded.recipe.lora is None:
        print(f"note: --full-weights: {source} is a full fine-tune, so there is no LoRA to merge; transformer/ holds"
              " its full weights, as for every full fine-tune", file=sys.stderr)
    licence = base_licence(backbone_config.type, base.ref if base.kind != "flowrl" else "")
    if base.kind == "folder":  # the card names the folder by its name only; the copy is said (it may not be
        licence = (licence[0], licence[1].replace(f"`{base.ref}`", f"`{base.shown}`"))  # the user's to share)
        print(f"note: base/ holds a copy of the local base {base.shown} (licence: {licence[0]}), which the card's"
              " code loads; its licence decides whether the folder may be shared", file=sys.stderr)
    rows = list(prompts) or (loaded.prompts.heldout() or [])[:SAMPLE_PROMPTS]
    staging = out.parent / f".{out.name}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        # the samples first: merging a LoRA (--full-weights) changes the loaded transformer in place
        sample_file = _write_samples(loaded, staging, rows, per_prompt) if rows and per_prompt > 0 else ""
        example = _example(loaded, rows)  # its condition images are in the folder: the card's --image runs there
        sources = source_files(rows if sample_file else [], example, staging)
        _write_weights(loaded, staging, full_weights)
        if base.kind == "folder":
            _copy_base(base, staging)
        recipe_text = (source / "recipe.toml").read_text(encoding="utf-8")
        (staging / "recipe.toml").write_text(portable_recipe(recipe_text, base.recipe_path, Path.cwd()),
                                             encoding="utf-8")
        facts = _facts(loaded, run, base, source, rows, sample_file, full_weights, licence, example, sources)
        (staging / "README.md").write_text(model_card(facts), encoding="utf-8")
        manifest = Manifest(step=loaded.step, checkpoint=source.name,
                            weights="lora" if loaded.recipe.lora is not None else "transformer",
                            base=BASE_FOLDER if base.kind == "folder" else "")
        (staging / "flowrl_export.json").write_text(manifest.to_json(), encoding="utf-8")
        scrub_configs(staging)
        local = machine_paths(run, source, Path(base.ref) if base.kind == "folder" else None, out.parent)
        for file, found in leaks(staging, local):  # said, not silent: a path the scrub does not know
            print(f"note: {out / file.relative_to(staging)} names the local path {found}", file=sys.stderr)
        if out.exists():
            out.rmdir()  # empty (checked above)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out
