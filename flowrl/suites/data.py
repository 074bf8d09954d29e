"""Prompt sets fetched from their public sources (``flowrl data fetch NAME``) into the data folder
(:func:`data_root`), normalised to ``prompts.jsonl``; each with its licence. Files are
pinned to a commit and a sha256 where the source is versioned; a download that does not match is refused.
GenEval 2's prompts are CC BY-NC 4.0: fetched for your own evaluation, never shipped with flowrl."""

from __future__ import annotations

import hashlib
import json
import os
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from flowrl.core.errors import UserError
from flowrl.suites.converters import CONVERTERS, FetchError

RAW = "https://raw.githubusercontent.com"
T2I = f"{RAW}/Karine-Huang/T2I-CompBench/1b7094991a57f3c22abdd4f6e8ba6c1a15517073/examples/dataset"
UNIGEN = f"{RAW}/CodeGoat24/UniGenBench/49d0bcebb0b9418d975d3957c2fee10f34811d14"


@attrs.frozen
class Source:
    url: str
    sha256: str | None  # None: the source is not versioned; the fetch records the sha256 it got
    licence: str
    convert: str  # how the file becomes prompts.jsonl: "geneval", "jsonl", "tsv", "json", "csv" or a suite's own
    # (flowrl/suites/converters.py)


SOURCES: dict[str, tuple[Source, ...]] = {
    "geneval": (Source(f"{RAW}/djghosh13/geneval/af4902f24d3ca90ebbb446dd9891a59e0f82725f/prompts/"
                       "evaluation_metadata.jsonl",
                       "5c48e0813e812e3c373fa5c8ed07a8f0a483be30272b4427b0559c8048e67c13", "MIT", "geneval"),),
    "geneval2": (Source(f"{RAW}/facebookresearch/GenEval2/a6e82d2289e8d418f27f0adee77908b07060eea3/"
                        "geneval2_data.jsonl",
                        "09233adbc9f877fba205f1a20efa4a8640e7e62a91dfd55893562bed8a928e43",
                        "CC BY-NC 4.0 (non-commercial; never redistributed by flowrl)", "jsonl"),),
    "partiprompts": (Source(f"{RAW}/google-research/parti/5a657978134374ce28973948331b319adef164bd/PartiPrompts.tsv",
                            "fab29e41bb512a169b56acab4cf2a41dcb675e285df2efcde6640c7dd3c440eb", "Apache-2.0", "tsv"),),
    "hpsv2": tuple(Source(f"https://huggingface.co/datasets/zhwang/HPDv2/resolve/main/benchmark/{style}.json", None,
                          "HPDv2 dataset terms (Apache-2.0 code; the prompt files' own licence is not stated)", "json")
                   for style in ("anime", "concept-art", "paintings", "photo")),
    "drawbench": (Source("https://docs.google.com/spreadsheets/d/1y7nAbmR4FREi6npB1u-Bo3GFdwdOPYJc617rBOxIRHY/gviz/"
                         "tq?tqx=out:csv", None, "unstated (the Imagen authors' published sheet)", "csv"),),
    # DPG-Bench (ELLA's repository, Apache-2.0): the question graph of each of its 1,065 prompts. The file is not
    # in the snapshot this was pinned from (too large for it), so no sha256: its git blob id is checked instead.
    "dpgbench": (Source(f"{RAW}/TencentQQGYLab/ELLA/3c228f1dc6c4d3cad0a47493816151a419f14db3/dpg_bench/dpg_bench.csv",
                        None, "Apache-2.0", "dpgbench"),),
    # T2I-CompBench++ (MIT): the 300 validation prompts of each of its 8 categories, and the lists its 3-in-1 score
    # reads to tell complex prompts with a spatial or an action relation
    "t2icompbench": tuple(Source(f"{T2I}/{stem}.txt", digest, "MIT", "t2icompbench") for stem, digest in (
        ("color_val", "1634259756dbc77d13093d907d414480080ec9790a8c97ad09efaea7b2534f2d"),
        ("shape_val", "37e1a276906c7ea9516cbd7ac8501be896006c0c17ca7344f260562834455bae"),
        ("texture_val", "fbb5363515b4a28009e360afaaaf389d2dd2289e50dbb0c6ef4ea0c7fe4f3d4f"),
        ("spatial_val", "8707a1d7e42ce3002d95363cf55f74bd043c843ae27108f5125aaaa7840ca988"),
        ("3d_spatial_val", "c9953597315f36a5fcb41291bb19bdc6ab5f64a0fa760d691b4854a73f5d1fe9"),
        ("non_spatial_val", "04c56cc9ac441dc9ea6c5157652058bd1635b5308526dd31bb29a1caab9a758d"),
        ("complex_val", "1b808018b8d9916db3d47d5aa2ef18377a3549a56901a474156f799824cdf3b4"),
        ("numeracy_val", "dad8df141604b70ba7554bec724e3db0a80023680769b5c514854ea2d2527bbe"),
        ("complex_val_spatial", "6c7ac0ab75c7c9080cfc7b421fb059b9b0febb98471707aeedf58771088abc02"),
        ("complex_val_action", "d49ee4c7f99e3f3379fb8704a54ff5288b83bb412971edf616a4721c2473308e"))),
    # UniGenBench++ (its License.txt: CC BY 4.0, Tencent): 600 prompts in four forms, each with its testpoints
    "unigenbench": tuple(Source(f"{UNIGEN}/data/test_prompts_{form}.csv", digest, "CC BY 4.0 (attribution: Tencent, "
                                "UniGenBench)", "unigenbench") for form, digest in (
        ("en", "f82e8ce854985ef963378eaaf8ce12f2e3a57dd6f53e1aea84a61fbeadfe4459"),
        ("en_long", "5d2c3d642cc4923504b662ad15b425c2d161a137884701881e00c2691a697253"),
        ("zh", "7ff2d2131e68e6182f43a28ecf03d070f7735788f3c5420db3f83141492e8cb3"),
        ("zh_long", "6e281a5781878584db932a3bfd16dc51afb195566eb7a30c17fb9c09fd3b1776"))),
    # the judge's instructions of UniGenBench++'s evaluation (its templates and checkpoint explanations, read from
    # the pinned file at fetch time, never copied into flowrl): one record per language
    "unigenbench-judge": (Source(f"{UNIGEN}/eval/src/eval_common.py",
                                 "c26c91cc65be7ed4234f07a310eed8812888c83b8b83b1934b77b1f48c463eb9",
                                 "CC BY 4.0 (the repository's License.txt)", "unigenbench-judge"),),
}


class PromptSetError(UserError, FileNotFoundError):
    """A prompt set that is not here (fetch it) or cannot be read."""


def data_root() -> Path:
    """Where fetched prompt sets live: ``$FLOWRL_DATA``, else ``~/.cache/flowrl/data``."""
    return Path(os.environ.get("FLOWRL_DATA") or Path.home() / ".cache" / "flowrl" / "data")


def fetched(name: str) -> Path:
    """The normalised prompt file of a fetched set; a one-line error naming the command that fetches it."""
    path = data_root() / name / "prompts.jsonl"
    if path.exists():
        return path
    if name not in SOURCES:  # no public source to fetch from (Flow-GRPO's OCR prompts): the user's own file
        raise PromptSetError(f"the {name} suite has no prompt set to fetch: give a prompt file with --set "
                             "prompts=FILE (one prompt a line)")
    raise PromptSetError(f"the {name} prompts are not in {path.parent}: fetch them on a networked machine with "
                         f"`flowrl data fetch {name}` (then copy that folder here, or set FLOWRL_DATA), or give "
                         "a prompt file of your own (--set prompts=FILE)")


def _download(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            return bytes(response.read())
    except OSError as error:
        raise FetchError(f"cannot fetch {url} ({error}); this needs a networked machine") from None


def _rows(name: str, source: Source, raw: bytes) -> list[dict[str, Any]]:
    text = raw.decode("utf-8")
    if source.convert in CONVERTERS:
        return CONVERTERS[source.convert](source.url, raw)
    if source.convert == "geneval":  # tag becomes the category; the clauses stay for the rules
        return [{**row, "category": row["tag"]} for row in map(json.loads, text.splitlines()) if row]
    if source.convert == "jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    if source.convert == "json":
        style = Path(source.url).stem
        return [{"prompt": p, "category": style} for p in json.loads(text)]
    if source.convert == "tsv":
        lines = text.splitlines()
        header = lines[0].split("\t")
        return [dict(zip(["prompt" if h == "Prompt" else "category" if h == "Category" else h.lower()
                          for h in header], line.split("\t"), strict=False)) for line in lines[1:] if line]
    import csv
    import io

    return [{"prompt": r["Prompts"], "category": r.get("Category", "")} for r in csv.DictReader(io.StringIO(text))]


def fetch(name: str, download: Callable[[str], bytes] = _download) -> Path:
    """Fetch ``name``'s files, check them, write ``DATA/name/prompts.jsonl`` and ``SOURCE.json``; returns it."""
    if name not in SOURCES:
        raise FetchError(f"unknown prompt set '{name}' (known: {', '.join(SOURCES)})")
    rows, seen = [], []
    for source in SOURCES[name]:
        raw = download(source.url)
        digest = hashlib.sha256(raw).hexdigest()
        if source.sha256 is not None and digest != source.sha256:
            raise FetchError(f"{source.url}: sha256 {digest} is not the pinned {source.sha256}; nothing written")
        rows += _rows(name, source, raw)
        seen.append({"url": source.url, "sha256": digest, "pinned": source.sha256 is not None,
                     "licence": source.licence})
    bad = next((i for i, row in enumerate(rows) if not isinstance(row.get("prompt"), str)), None)
    if bad is not None:  # a source whose format changed: nothing written
        raise FetchError(f"{name}: record {bad + 1} of the fetched files has no prompt; nothing written")
    folder = data_root() / name
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / "prompts.jsonl.tmp"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    tmp.replace(folder / "prompts.jsonl")
    (folder / "SOURCE.json").write_text(json.dumps({"name": name, "files": seen, "prompts": len(rows)}, indent=2))
    return folder / "prompts.jsonl"
