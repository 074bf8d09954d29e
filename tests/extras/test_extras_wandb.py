"""Weights & Biases as a tracker (``trainer.loggers = ["tensorboard", "wandb"]``), offline: a tiny run logs the
same scalars as metrics.jsonl, its image grids and the resolved recipe, and ``--resume`` continues the same
wandb run (one id, kept in the run folder)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("FLOWRL_EXTRAS") != "1" and os.environ.get("FLOWRL_WANDB") != "1":  # set by `nox -s extras`
    pytest.skip("needs the extras environment (nox -s extras)", allow_module_level=True)

wandb = pytest.importorskip("wandb")

import sys  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import tiny_recipe  # noqa: E402

from flowrl.config.recipe import recipe_from_dict  # noqa: E402
from flowrl.trainer.loop import Trainer  # noqa: E402
from flowrl.trainer.runfolder import read_metrics  # noqa: E402
from flowrl.trainer.trackers import IDS_FILE  # noqa: E402


def _records(run_file: Path) -> list[Any]:
    """The protobuf records of an offline run's ``.wandb`` file: a 7-byte file header (``:W&B``, magic,
    version), then 32 KiB blocks of chunks, each with a 7-byte header (CRC, length, kind: 1 whole, 2 first,
    3 middle, 4 last); a block's tail shorter than a header is padding."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    pos, bodies, partial = 7, [], b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:  # zero padding to the end of the block
            pos += left
            continue
        body, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 1:
            bodies.append(body)
        elif kind == 2:
            partial = body
        elif kind == 3:
            partial += body
        elif kind == 4:
            bodies.append(partial + body)
    records = []
    for body in bodies:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(body)
        records.append(record)
    return records


def _history(run_dir: Path) -> tuple[dict[int, dict[str, Any]], dict[str, Any], list[str]]:
    """Per step the logged values, the run's config and the run ids, over every offline run of the folder."""
    history: dict[int, dict[str, Any]] = {}
    config: dict[str, Any] = {}
    ids = []
    for run_file in sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb")):
        for record in _records(run_file):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                ids.append(record.run.run_id)
                config.update({item.key: json.loads(item.value_json) for item in record.run.config.update})
            elif kind == "history":
                items = record.history.item
                row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}
                history.setdefault(int(row["_step"]), {}).update(row)
    return history, config, ids


def test_wandb_gets_the_scalars_images_and_recipe_and_resume_continues_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    data = tiny_recipe(max_steps=2, checkpoint_every=1, image_every=1, loggers=["tensorboard", "wandb"])
    run = tmp_path / "run"
    Trainer(recipe_from_dict(data), run, quiet=True).run()
    first_id = json.loads((run / IDS_FILE).read_text())["wandb"]
    data["trainer"]["max_steps"] = 3
    Trainer(recipe_from_dict(data), run, resume=run / "checkpoints" / "step_000002", quiet=True).run()
    assert json.loads((run / IDS_FILE).read_text())["wandb"] == first_id

    history, config, ids = _history(run)
    assert ids == [first_id, first_id]  # the resumed process continued the same run
    assert config["trainer"]["loggers"] == ["tensorboard", "wandb"] and config["name"] == data["name"]
    rows = [r for r in read_metrics(run / "metrics.jsonl") if r["step"] >= 1]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for row in rows:
        logged = history[row["step"]]
        numbers = {k: v for k, v in row.items() if k != "step" and isinstance(v, int | float)}
        assert numbers and all(logged[k] == pytest.approx(v, rel=1e-6) for k, v in numbers.items())  # JSON floats
        assert logged["rollouts/_type"] == "image-file"
