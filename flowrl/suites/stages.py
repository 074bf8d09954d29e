"""The two stages of a suite run, each resumable: ``generate`` (images and a manifest) and ``score`` (figures per
image, then the summary). A result folder ``OUT/<tag>/<suite>/`` holds:

    run.json          the suite, its config, the protocol used (and whether it is the pinned one), the checkpoint
                      and the sha256 of its weights
    manifest-*.jsonl  one row per image written: key, prompt index, image index, prompt, category, file
    images/           PNG per image (``P_K.png``), or float arrays (``.npy``) for a lossless suite or a video base
    scores.jsonl      one row per scored image: key and figures (scoring.json: the scorer settings they used)
    summary.json      the suite's figures, per-prompt figures for paired comparisons, and the run.json facts
    samples.png       the first prompts' images, a row each (their prompts in samples.txt)

Generation writes an image before its manifest row, and scoring appends a row per image after each batch, so a
kill loses at most the batch in flight; the next call does only what is missing.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from flowrl.core.errors import UserError
from flowrl.suites.interface import Item, Suite
from flowrl.suites.protocol import Protocol, initial_noise
from flowrl.utils.jsonl import append_rows, read_rows

RUN, SUMMARY, SCORES, SCORING = "run.json", "summary.json", "scores.jsonl", "scoring.json"


class SuiteError(UserError, ValueError):
    """A result folder, manifest, image or scorer that cannot be used; the message names the file."""


def image_key(prompt: int, image: int) -> str:
    return f"{prompt:05d}_{image:02d}"


def jobs(items: Sequence[Item], protocol: Protocol, shard: tuple[int, int], limit: int | None) -> list[tuple[int, int]]:
    """(prompt index, image index) of every image this shard makes: prompts ``i`` with ``i % n == shard``."""
    index, count = shard
    prompts = range(len(items) if limit is None else min(limit, len(items)))
    return [(p, k) for p in prompts if p % count == index for k in range(protocol.images)]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of a JSON-lines file; a torn last line (a kill mid-write) is dropped, a bad earlier one refused."""
    return read_rows(path, SuiteError)


def weights_hash(source: Path, lora: str = "") -> str:
    """sha256 of a checkpoint's weights file (an export folder's weight files), or of a recipe file (an initial
    policy: the base's own weights) and, for a LoRA trained elsewhere, of its weight files too."""
    from flowrl.trainer.checkpoints.manifest import weight_files  # a checkpoint's weights file, or an export folder's

    files = [source] if source.suffix == ".toml" else weight_files(source)
    if lora:
        found = Path(lora)
        files += sorted(found.rglob("*.safetensors")) if found.is_dir() else [found]
    digest = hashlib.sha256()
    for path in files:
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return ("recipe:" if source.suffix == ".toml" else "") + digest.hexdigest()


def check_run(folder: Path, facts: dict[str, Any]) -> None:
    """Write ``run.json``, or check that the one there describes the same suite, protocol and weights."""
    path = folder / RUN
    if path.exists():
        try:
            found = json.loads(path.read_text())
        except ValueError:
            raise SuiteError(f"{path} is not valid JSON; remove the result folder or choose another --out") from None
        for key in ("suite", "config", "protocol", "weights_sha256", "limit"):
            if found.get(key) != facts.get(key):
                raise SuiteError(f"{path}: made with another {key} ({found.get(key)!r}, now {facts.get(key)!r});"
                                 " choose another --out or --tag")
        return
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(facts, indent=2))


@contextmanager
def folder_lock(folder: Path, what: str) -> Iterator[None]:
    """Hold an exclusive lock on ``folder`` for ``what`` (a shard's generation, the scoring): a second process
    doing the same in the same folder at once is refused in one line instead of making the same images twice."""
    try:
        import fcntl
    except ImportError:  # no advisory locks here: the manifests still keep each image once
        yield
        return
    folder.mkdir(parents=True, exist_ok=True)
    name = "".join(c if c.isalnum() else "-" for c in what)
    with (folder / f".lock-{name}").open("a+") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise SuiteError(f"{folder}: another process is {what} here; wait for it to finish") from None
        yield


def written(folder: Path, present: bool = False) -> dict[str, dict[str, Any]]:
    """The manifest rows of every shard by key (``present``: only those whose image is there)."""
    rows = {}
    for manifest in sorted(folder.glob("manifest-*.jsonl")):
        for row in read_jsonl(manifest):
            if "key" not in row or "file" not in row:
                raise SuiteError(f"{manifest}: a row without key or file; the manifest is damaged")
            if not present or (folder / str(row["file"])).exists():
                rows[str(row["key"])] = row
    return rows


def save_image(image: Tensor, path: Path, lossless: bool) -> None:
    from PIL import Image

    if lossless:
        np.save(path, image.detach().float().cpu().numpy())
        return
    pixels = (image.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).cpu().numpy()
    Image.fromarray(pixels).save(path)


def load_image(path: Path) -> Tensor:
    """An image ``(3, H, W)`` (or a clip) in [0, 1] from a PNG or a float array; :class:`SuiteError` naming it."""
    if not path.exists():
        raise SuiteError(f"{path}: the image is missing; run the generate stage again (it makes only what is missing)")
    try:
        if path.suffix == ".npy":
            return torch.from_numpy(np.load(path))
        from PIL import Image

        with Image.open(path) as opened:
            pixels = np.asarray(opened.convert("RGB"), dtype=np.float32) / 255.0
        return torch.from_numpy(pixels).permute(2, 0, 1).contiguous()
    except Exception as error:
        raise SuiteError(f"{path}: not a readable image ({type(error).__name__}: {error})") from None


def batches(rows: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(rows), size):
        yield rows[start : start + size]


def generate(policy: Any, suite: Suite, protocol: Protocol, folder: Path, facts: dict[str, Any],
             shard: tuple[int, int] = (0, 1), limit: int | None = None, batch: int = 16, quiet: bool = False) -> int:
    """Make this shard's missing images of ``suite`` with ``policy`` (a :class:`flowrl.export.loading.LoadedPolicy`
    built for ``protocol``); returns how many were made."""
    from flowrl.core.types import Plan
    from flowrl.evaluation.evaluate import sample_images

    items = suite.items()
    check_run(folder, facts)
    (folder / "images").mkdir(exist_ok=True)
    done = written(folder, present=True)  # an image lost since is made again
    todo = [(p, k) for p, k in jobs(items, protocol, shard, limit) if image_key(p, k) not in done]
    manifest = folder / f"manifest-{shard[0]:03d}of{shard[1]:03d}.jsonl"
    order = [p * protocol.images + k for p, k in todo]
    plan = Plan(units=(), trained=())
    with tqdm(total=len(todo), desc=f"generate {facts['suite']}", unit="img", disable=quiet) as bar:
        for chunk, rows in zip(batches(todo, batch), batches(order, batch), strict=True):
            prompts = [items[p].prompt for p, _ in chunk]
            noise = initial_noise(policy.backbone, protocol, prompts, [k for _, k in chunk], rows)
            with torch.no_grad():
                images = sample_images(policy.backbone, prompts, policy.schedule, protocol.seed, plan, len(chunk),
                                       initial=noise)
            lossless = suite.lossless or images.dim() == 5
            lines = []
            for (p, k), image in zip(chunk, images, strict=True):
                name = f"images/{image_key(p, k)}.{'npy' if lossless else 'png'}"
                save_image(image, folder / name, lossless)
                lines.append({"key": image_key(p, k), "prompt_index": p, "image": k, "prompt": items[p].prompt,
                              "category": items[p].category, "file": name})
            append_rows(manifest, lines)
            bar.update(len(chunk))
    if todo:
        contact_sheet(folder, items)
    return len(todo)


def contact_sheet(folder: Path, items: Sequence[Item], prompts: int = 8) -> None:
    """``samples.png``: the images of the first ``prompts`` prompts written so far, one row per prompt, and
    ``samples.txt`` with those prompts in order (to look at before reading any figure)."""
    from flowrl.trainer.logger import save_grid_png
    from flowrl.utils.video import as_stills

    rows = sorted(written(folder, present=True).values(), key=lambda r: (r["prompt_index"], r["image"]))
    chosen = sorted({int(r["prompt_index"]) for r in rows})[:prompts]
    picked = [r for r in rows if int(r["prompt_index"]) in chosen]
    if not picked:
        return
    images = as_stills(torch.stack([load_image(folder / r["file"]) for r in picked]))
    save_grid_png(images, rows=len(chosen), path=folder / "samples.png", scale=max(1, 96 // images.shape[-2]))
    (folder / "samples.txt").write_text("".join(items[p].prompt + "\n" for p in chosen), encoding="utf-8")


def score(suite: Suite, folder: Path, batch: int = 32, quiet: bool = False,
          scoring: dict[str, Any] | None = None) -> dict[str, Any]:
    """Score every generated image not scored yet with the scorer settings ``scoring`` (kept in ``scoring.json``:
    scores made with other settings are refused, not mixed), then write and return ``summary.json``."""
    run_path = folder / RUN
    if not run_path.exists():
        raise SuiteError(f"{run_path} is missing: {folder} is not a suite result folder (generate it first)")
    facts = json.loads(run_path.read_text())
    items = suite.items()
    rows = written(folder)
    if not rows:
        raise SuiteError(f"{folder}: no manifest rows (manifest-*.jsonl); run the generate stage first")
    scores_path = folder / SCORES
    check_scoring(folder, scoring)
    scored = {str(r["key"]): r for r in read_jsonl(scores_path)}
    todo = [rows[key] for key in sorted(rows) if key not in scored]
    for row in todo:
        index = int(row["prompt_index"])
        if not 0 <= index < len(items) or str(items[index].prompt) != row["prompt"]:
            raise SuiteError(f"{folder}: image {row['key']} was made for another prompt set (prompt "
                             f"{row['prompt']!r}); score it with the suite it was generated with")
    if todo:
        suite.check()
    with tqdm(total=len(todo), desc=f"score {facts['suite']}", unit="img", disable=quiet) as bar:
        for chunk in batches(todo, batch):
            images = torch.stack([load_image(folder / row["file"]) for row in chunk])
            chosen = [items[int(row["prompt_index"])] for row in chunk]
            try:
                figures = suite.score(images, chosen)
            except UserError:
                raise
            except Exception as error:
                raise SuiteError(f"suite '{facts['suite']}' failed to score {folder / chunk[0]['file']} and its "
                                 f"batch: {type(error).__name__}: {error}") from error
            lines = [{"key": row["key"], **{k: float(v) for k, v in f.items()}}
                     for row, f in zip(chunk, figures, strict=True)]
            bad = next(((row, k) for row, line in zip(chunk, lines, strict=True) for k, v in line.items()
                        if k != "key" and not math.isfinite(v)), None)
            if bad is not None:  # nothing of this batch is kept: the folder stays as it was, scorable again
                raise SuiteError(f"suite '{facts['suite']}' scored {folder / bad[0]['file']} (prompt "
                                 f"{bad[0]['prompt']!r}) {bad[1]} = {lines[chunk.index(bad[0])][bad[1]]}: a score must "
                                 "be a finite number; mend the scorer and score again (--stage score)")
            append_rows(scores_path, lines)
            scored.update({row["key"]: line for row, line in zip(chunk, lines, strict=True)})
            bar.update(len(chunk))
    return summarise(suite, items, folder, facts, rows, scored)


def check_scoring(folder: Path, scoring: dict[str, Any] | None) -> None:
    """Write ``scoring.json``, or refuse settings other than those the scores there were made with."""
    path, scoring = folder / SCORING, scoring or {}
    found = json.loads(path.read_text()) if path.exists() else None
    if found is not None and found != scoring and (folder / SCORES).exists():
        raise SuiteError(f"{folder / SCORES} was scored with other scorer settings ({found}, now {scoring}); move it"
                         " aside to score again with these")
    path.write_text(json.dumps(scoring, indent=2))


def summarise(suite: Suite, items: Sequence[Item], folder: Path, facts: dict[str, Any],
              rows: dict[str, dict[str, Any]], scored: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per-prompt figures (the mean over its images), the suite's aggregate, its headline's definition, each
    prompt's identity (for pairing) and what the result may claim (:mod:`flowrl.suites.comparability`), into
    ``summary.json``."""
    from flowrl.suites.comparability import item_hash, prompt_problems, protocol_problems, set_hash

    by_prompt: dict[int, list[dict[str, Any]]] = {}
    for key, row in rows.items():
        by_prompt.setdefault(int(row["prompt_index"]), []).append({k: v for k, v in scored[key].items() if k != "key"})
    prompts = sorted(by_prompt)
    per_prompt = [{k: float(np.mean([f[k] for f in by_prompt[p]])) for k in by_prompt[p][0]} for p in prompts]
    figures = suite.aggregate(per_prompt, [items[p] for p in prompts]) if per_prompt else {}
    protocol = suite_protocol(facts)
    expected_jobs = jobs(items, protocol, (0, 1), facts.get("limit"))
    scoring = json.loads((folder / SCORING).read_text()) if (folder / SCORING).exists() else {}
    keys = [k for k in (per_prompt[0] if per_prompt else {}) if not k.startswith("_")]
    images = [scored[key] for key in rows]
    proportions = [k for k in keys if all(f[k] in (0.0, 1.0) for f in images)  # every image scored 0 or 1
                   or (k in suite.fractions and all(0.0 <= f[k] <= 1.0 for f in images))]
    used = [items[p] for p in sorted({p for p, _ in expected_jobs})]
    differs = protocol_problems(facts) + prompt_problems(used, suite.published_items(), suite.prompt_source())
    differs += suite.scorer_problems(scoring)
    if len(rows) != len(expected_jobs):
        differs.append(f"incomplete: {len(rows)} of {len(expected_jobs)} images generated and scored")
    summary = {**facts, "scoring": scoring, "figures": figures, "primary": suite.primary,
               "headline": suite.headline(), "proportions": proportions, "images": len(rows),
               "images_per_prompt": protocol.images, "expected_images": len(expected_jobs),
               "complete": len(rows) == len(expected_jobs), "comparable": not differs, "differs": differs,
               "prompts_sha256": set_hash(used), "prompts": prompts,
               "item_hashes": [item_hash(items[p]) for p in prompts],
               "categories": [items[p].category for p in prompts], "per_prompt": per_prompt}
    write_atomically(folder / SUMMARY, json.dumps(summary, indent=1))
    return summary


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a fresh file renamed into place: a kill leaves the old file or the new."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def suite_protocol(facts: dict[str, Any]) -> Protocol:
    return Protocol(**facts["protocol"])
