"""Generated faults: user-written parts that misbehave, and writes the file system refuses, through the real
command line. Each case ends in one line naming the part or the path (a raising part's own traceback above it),
exit status 2, and a run folder that ``--resume`` continues once the fault is gone.

A part misbehaves only while ``FLOWRL_FAULT`` names the fault, so the same recipe (the same part types: a resumed
run keeps its parts) trains on once the variable is cleared, as a mended part would.
"""

from __future__ import annotations

import errno
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
from conftest import tiny_recipe

from flowrl import Plan, RewardModel, TimestepSelector, Unit
from flowrl.cli.main import main
from flowrl.config.tomlwrite import dumps
from flowrl.core.types import Schedule


def fault() -> str:
    return os.environ.get("FLOWRL_FAULT", "")


class Faulty(RewardModel):
    """Mean brightness, or the fault ``FLOWRL_FAULT`` names."""

    @attrs.frozen
    class Config:
        pass

    def score(self, images: torch.Tensor, prompts: list[str]) -> Any:
        good = images.mean(dim=(1, 2, 3))
        return {
            "": lambda: good,
            "raise": lambda: (_ for _ in ()).throw(ValueError("my reward broke")),
            "exit": lambda: sys.exit(3),
            "type": lambda: good.tolist(),
            "shape": lambda: images.mean(dim=(2, 3)),
            "device": lambda: torch.empty(len(images), device="meta"),
            "complex": lambda: good.to(torch.complex64),
            "dtype": lambda: (good > 0.5).long(),  # integers: read as float scores (allowed)
            "mutate": lambda: images.mul_(0).mean(dim=(1, 2, 3)) + good,  # its input changes: its own copy
            "nan": lambda: torch.full_like(good, float("nan")),
        }[fault()]()


class FaultySelector(TimestepSelector):
    """Trains steps 0 and 1, or the fault ``FLOWRL_FAULT`` names, in ``plan`` or ``observe``."""

    @attrs.frozen
    class Config:
        pass

    def observe(self, backbone: Any, prompts: list[str], schedule: Schedule) -> None:
        if fault() == "observe":
            raise RuntimeError("my observe broke")

    def plan(self, schedule: Schedule, iteration: int, generator: torch.Generator) -> Any:
        if fault() == "plan-raise":
            raise KeyError("window")
        if fault() == "plan-exit":
            sys.exit(4)
        if fault() == "plan-type":
            return [(0, 1), (1, 1)]
        return Plan(units=(Unit(0), Unit(1), Unit(2)), trained=(0, 1))


def _recipe(folder: Path, **trainer: Any) -> Path:
    data = tiny_recipe(**{"max_steps": 2, "eval_every": 0, "checkpoint_every": 1, **trainer})
    data["reward"] = [{"type": "test_user_parts:Faulty"}]
    data["selector"] = {"type": "test_user_parts:FaultySelector"}
    path = folder / "recipe.toml"
    path.write_text(dumps(data))
    return path


def _train(folder: Path, *extra: str) -> int:
    return main(["train", str(folder / "recipe.toml"), "--quiet", *extra])


# fault -> (exit status, what the last stderr line holds, the part's traceback shown above it)
PART_FAULTS = {
    "raise": (2, "reward 'test_user_parts:Faulty' (Faulty) failed: ValueError: my reward broke", True),
    "exit": (2, "reward 'test_user_parts:Faulty' (Faulty) failed: called sys.exit(3)", True),
    "type": (2, "reward 'test_user_parts:Faulty' returned a list; score() must return a tensor", False),
    "shape": (2, "reward 'test_user_parts:Faulty' returned shape (8, 3), expected (8,)", False),
    "device": (2, "reward 'test_user_parts:Faulty' returned a torch.float32 tensor on meta", False),
    "complex": (2, "reward 'test_user_parts:Faulty' returned a torch.complex64 tensor", False),
    "observe": (2, "selector 'test_user_parts:FaultySelector' failed in observe() at iteration 1: RuntimeError", True),
    "plan-raise": (2, "selector 'test_user_parts:FaultySelector' failed in plan() at iteration 1: KeyError", True),
    "plan-exit": (2, "selector 'test_user_parts:FaultySelector' failed in plan() at iteration 1: called sys.exit(4)",
                  True),
    "plan-type": (2, "selector 'test_user_parts:FaultySelector' returned a list from plan() at iteration 1", False),
}


@pytest.mark.parametrize("name", list(PART_FAULTS))
def test_a_misbehaving_part_is_one_line_and_the_run_resumes(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    _recipe(tmp_path)
    run = tmp_path / "run"
    monkeypatch.setenv("FLOWRL_FAULT", "")
    assert _train(tmp_path, "--output-dir", str(run), "--set", "trainer.max_steps=1") == 0  # step 1 goes well
    monkeypatch.setenv("FLOWRL_FAULT", name)
    capsys.readouterr()
    status, line, traceback = PART_FAULTS[name]
    assert _train(tmp_path, "--resume", str(run)) == status  # fails in iteration 2
    err = capsys.readouterr().err.strip().splitlines()
    assert line in err[-1] and err[-1].startswith("error: "), err[-1]
    assert "step_000001 holds step 1: once the part is mended, continue with --resume" in err[-1]
    assert ("Traceback (most recent call last):" in err) == traceback  # the part's own, where its bug is
    monkeypatch.setenv("FLOWRL_FAULT", "")
    assert _train(tmp_path, "--resume", str(run)) == 0
    steps = [json.loads(r)["step"] for r in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]  # the failed iteration ran again, once


def test_what_a_reward_may_return_or_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture) -> None:
    """Integer scores are read as floats; a reward that zeroes its input scored its own copy; NaN scores skip
    the steps, and a run that trained nothing says so (exit 2) and still resumes."""
    _recipe(tmp_path)
    for name in ("dtype", "mutate"):
        monkeypatch.setenv("FLOWRL_FAULT", name)
        assert _train(tmp_path, "--output-dir", str(tmp_path / name)) == 0
    rows = [json.loads(r) for r in (tmp_path / "mutate" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["reward/total"] > 0.05 for r in rows)  # zeroed images would give 0 + mean of zeros
    monkeypatch.setenv("FLOWRL_FAULT", "nan")
    capsys.readouterr()
    assert _train(tmp_path, "--output-dir", str(tmp_path / "nan")) == 2
    assert "the run trained nothing: 2 iterations, 2 skipped for NaN or inf" in capsys.readouterr().err
    monkeypatch.setenv("FLOWRL_FAULT", "")
    assert _train(tmp_path, "--resume", str(tmp_path / "nan"), "--set", "trainer.max_steps=3") == 0


# -- the file system refuses a write ------------------------------------------------------------------------
def _full(filename: str = "") -> OSError:
    return OSError(errno.ENOSPC, "No space left on device", filename or None)


def _checkpoints(monkeypatch: pytest.MonkeyPatch, run: Path) -> str:
    from flowrl.trainer.checkpoints import folder as checkpoint

    real = checkpoint.save_file

    def refuse(tensors: Any, path: str) -> None:
        if "step_000002" in path:
            raise _full()
        real(tensors, path)

    monkeypatch.setattr(checkpoint, "save_file", refuse)
    return f"cannot write {run}/checkpoints/step_000002: the disk is full"


def _best(monkeypatch: pytest.MonkeyPatch, run: Path) -> str:
    """Each evaluation beats the last (its figure is the step), so best is replaced after every iteration; the
    replacement after iteration 2 is refused: the best of iteration 1 must survive it."""
    from flowrl.trainer import heldout
    from flowrl.trainer.checkpoints import folder as checkpoint

    real_evaluate = heldout.HeldOut.evaluate

    def rising(self: Any, grid_file: Path, step: int) -> dict[str, float]:
        return {**real_evaluate(self, grid_file, step), "eval/score": float(step)}

    real = checkpoint.save_file

    def refuse(tensors: Any, path: str) -> None:
        if "/best" in path and (run / "checkpoints" / "step_000001").is_dir():
            raise _full()
        real(tensors, path)

    monkeypatch.setattr(heldout.HeldOut, "evaluate", rising)
    monkeypatch.setattr(checkpoint, "save_file", refuse)
    return f"cannot write {run}/checkpoints/best: the disk is full"


def _metrics(monkeypatch: pytest.MonkeyPatch, run: Path) -> str:
    real = Path.open

    def refuse(self: Path, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if self.name == "metrics.jsonl" and "a" in mode and self.exists() and self.read_text().count("\n") >= 2:
            raise _full(str(self))
        return real(self, mode, *args, **kwargs)

    monkeypatch.setattr(Path, "open", refuse)
    return f"cannot write {run}/metrics.jsonl: the disk is full"


def _tensorboard(monkeypatch: pytest.MonkeyPatch, run: Path) -> str:
    from flowrl.trainer import trackers

    real = trackers.TensorBoard.scalars

    def refuse(self: Any, values: dict[str, float], step: int) -> None:
        if step == 2:
            raise _full(str(run / "tb" / "events"))
        real(self, values, step)

    monkeypatch.setattr(trackers.TensorBoard, "scalars", refuse)
    return f"cannot write {run}/tb/events: the disk is full"


def _samples(monkeypatch: pytest.MonkeyPatch, run: Path) -> str:
    from flowrl.trainer import logger

    real = logger.save_grid_png

    def refuse(images: Any, rows: int, path: Path, *args: Any, **kwargs: Any) -> None:
        if "step_000002" in str(path):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        real(images, rows, path, *args, **kwargs)

    monkeypatch.setattr(logger, "save_grid_png", refuse)
    return f"cannot write {run}/samples/step_000002.png: the file system is read-only"


WRITES: dict[str, Callable[[pytest.MonkeyPatch, Path], str]] = {
    "checkpoints": _checkpoints, "best": _best, "metrics": _metrics, "tensorboard": _tensorboard,
    "samples": _samples,
}


@pytest.mark.parametrize("name", list(WRITES))
def test_a_refused_write_is_one_line_and_the_run_resumes(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv("FLOWRL_FAULT", "")
    _recipe(tmp_path, eval_every=1, image_every=1, eval_prompts=1)
    run = tmp_path / "run"
    with monkeypatch.context() as patch:
        expected = WRITES[name](patch, run)
        assert _train(tmp_path, "--output-dir", str(run)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"error: {expected}") and "continue with --resume" in err[-1], err[-1]
    assert not any("Traceback" in line for line in err)
    assert not list((run / "checkpoints").glob("*.tmp"))  # no half-written staging folder
    assert (run / "checkpoints" / "best" / "trainer_state.json").exists()  # never without a complete best
    assert _train(tmp_path, "--resume", str(run)) == 0
    steps = [json.loads(r)["step"] for r in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2]


def test_a_refused_report_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setenv("FLOWRL_FAULT", "")
    _recipe(tmp_path)
    run = tmp_path / "run"
    assert _train(tmp_path, "--output-dir", str(run)) == 0
    real = Path.write_text

    def refuse(self: Path, *args: Any, **kwargs: Any) -> int:
        if self.name == "report.html.tmp":
            raise _full(str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", refuse)
    capsys.readouterr()
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: cannot write {run}/report.html.tmp: the disk is full; free space or choose another --out"]
    assert not (run / "report.html.tmp").exists() and not (run / "report.html").exists()
