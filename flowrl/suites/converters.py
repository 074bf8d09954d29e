"""How the files of DPG-Bench, T2I-CompBench++ and UniGenBench++ become ``prompts.jsonl`` records (one dict per
prompt, with a ``prompt`` string): ``CONVERTERS[name](url, raw bytes)``, used by ``flowrl data fetch``.

The formats, as their pinned files have them:

* DPG-Bench's ``dpg_bench.csv``: one row per question (``item_id``, ``text``, ``proposition_id``, ``dependency``:
  the parent question ids, ``0`` for none, ``tuple``: ``"CATEGORY - DETAIL (...)"``, ``question_natural_language``);
  a prompt's rows are consecutive. Every row is kept (the source's script skips the file's first data row).
* T2I-CompBench++'s ``CATEGORY_val.txt``: one prompt a line; ``complex_val_spatial.txt`` and
  ``complex_val_action.txt`` list the complex prompts with a spatial or an action relation (their records carry
  a ``_complex_...`` category, which the suite reads as marks, not as prompts).
* UniGenBench++'s ``test_prompts_FORM.csv``: ``index``, ``prompt_LANG`` and ``sub_dims_LANG`` (JSON: the
  testpoints and the description of each in this prompt).
* UniGenBench++'s ``eval/src/eval_common.py``: its judge instruction templates and checkpoint explanations,
  read as literals from the file's syntax tree (nothing in it runs).
"""

from __future__ import annotations

import ast
import csv
import hashlib
import io
import json
from collections.abc import Callable
from pathlib import PurePosixPath
from typing import Any

from flowrl.core.errors import UserError

DPG_BLOB = "98457fc9901943f51ff9a30367250fc292533bed"  # git's blob id of dpg_bench.csv at the pinned commit
UNIGEN_KEYS = {"en": ("Testpoints", "Testpoint Description"), "zh": ("考点", "考点对应描述")}
Records = list[dict[str, Any]]


class FetchError(UserError, OSError):
    """A prompt set that could not be fetched, or did not match its pinned checksum (flowrl.suites.data's error:
    it lives here, where the fetched files are checked and converted, so that data imports converters only)."""


def _refuse(message: str) -> Exception:
    return FetchError(message)


def git_blob(raw: bytes) -> str:
    """git's object id of a file's bytes (``git hash-object``)."""
    return hashlib.sha1(b"blob %d\0" % len(raw) + raw).hexdigest()


def dpgbench(url: str, raw: bytes) -> Records:
    if git_blob(raw) != DPG_BLOB:
        raise _refuse(f"{url}: git blob {git_blob(raw)} is not the pinned {DPG_BLOB}; nothing written")
    records: dict[str, dict[str, Any]] = {}
    for row in csv.DictReader(io.StringIO(raw.decode("utf-8"))):
        record = records.setdefault(row["item_id"], {"prompt": row["text"], "item_id": row["item_id"],
                                                     "questions": []})
        parents = [int(p) for p in row["dependency"].split(",") if p.strip() and int(p) != 0]
        record["questions"].append({"id": int(row["proposition_id"]), "parents": parents, "tuple": row["tuple"],
                                    "question": row["question_natural_language"]})
    return list(records.values())


def t2icompbench(url: str, raw: bytes) -> Records:
    stem = PurePosixPath(url).stem
    category = f"_{stem.replace('_val', '')}" if stem.startswith("complex_val_") else stem.removesuffix("_val")
    lines = [line.strip() for line in raw.decode("utf-8").splitlines()]
    return [{"prompt": line, "category": category} for line in lines if line]


def unigenbench(url: str, raw: bytes) -> Records:
    form = PurePosixPath(url).stem.removeprefix("test_prompts_")
    lang = form[:2]
    points, descriptions = UNIGEN_KEYS[lang]
    out = []
    for row in csv.DictReader(io.StringIO(raw.decode("utf-8"))):
        record = {"prompt": row[f"prompt_{lang}"], "category": form, "index": int(row["index"]), "lang": lang}
        try:  # one row of the pinned en_long file is not JSON (a missing comma): kept, marked, skipped by the suite
            dims = json.loads(row[f"sub_dims_{lang}"])
            record.update(testpoints=list(dims[points]), descriptions=list(dims[descriptions]))
        except (ValueError, KeyError, TypeError) as error:
            record.update(testpoints=[], descriptions=[], unreadable=f"sub_dims_{lang} is not readable ({error})")
        out.append(record)
    return out


def _literals(tree: ast.Module) -> dict[str, Any]:
    """Top-level assignments whose value is a literal; dicts of names keep their literal entries."""
    found: dict[str, Any] = {}
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        try:
            found[node.targets[0].id] = ast.literal_eval(node.value)
        except ValueError:
            if isinstance(node.value, ast.Dict):  # LANG_CONFIGS: per language, its string entries
                found[node.targets[0].id] = {
                    ast.literal_eval(k): {ast.literal_eval(a): b.value for a, b in zip(v.keys, v.values, strict=True)
                                          if isinstance(a, ast.Constant) and isinstance(b, ast.Constant)}
                    for k, v in zip(node.value.keys, node.value.values, strict=True)
                    if isinstance(k, ast.Constant) and isinstance(v, ast.Dict)}
    return found


def unigenbench_judge(url: str, raw: bytes) -> Records:
    names = _literals(ast.parse(raw.decode("utf-8")))
    try:
        return [{"prompt": names[f"SYSTEM_PROMPT_{lang.upper()}_TEMPLATE"], "category": lang,
                 "explanations": names[f"EXPLANATION_DICT_{lang.upper()}"],
                 "checkpoint_header": names["LANG_CONFIGS"][lang]["checkpoint_header"],
                 "checkpoint_desc_header": names["LANG_CONFIGS"][lang]["checkpoint_desc_header"]}
                for lang in ("en", "zh")]
    except KeyError as missing:
        raise _refuse(f"{url}: no {missing} in the file; nothing written") from None


CONVERTERS: dict[str, Callable[[str, bytes], Records]] = {
    "dpgbench": dpgbench, "t2icompbench": t2icompbench, "unigenbench": unigenbench,
    "unigenbench-judge": unigenbench_judge}
