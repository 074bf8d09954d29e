"""Faults a long run must survive: NaN rewards, raising rewards, signals, SIGKILL and resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest
import torch
from conftest import ROOT, tiny_recipe
from safetensors.torch import load_file

from flowrl import Plan, RewardModel, Schedule, TimestepSelector, Unit
from flowrl.config.recipe import recipe_from_dict
from flowrl.core.interfaces import RewardError
from flowrl.trainer import train
from flowrl.trainer.run_errors import NonFiniteError, NothingTrainedError
from flowrl.trainer.runfolder import RunFolderError, lock_run_folder


class NaNOnSecondCall(RewardModel):
    """Brightness, but NaN for some images on the second call (or on every call)."""

    @attrs.frozen
    class Config:
        always: bool = False

    calls = 0

    def score(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        NaNOnSecondCall.calls += 1
        out = images.mean(dim=(1, 2, 3))
        if self.config.always or NaNOnSecondCall.calls == 2:
            out[::3] = float("nan")
        return out


class Raises(RewardModel):
    """A reward whose model is broken."""

    @attrs.frozen
    class Config:
        pass

    def score(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        raise RuntimeError("CUDA out of memory (simulated)")


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def with_reward(reward: dict, **trainer: object) -> dict:
    data = tiny_recipe(**trainer)
    data["reward"] = [reward]
    return data


def test_nan_rewards_skip_the_step_and_are_counted(tmp_path: Path) -> None:
    NaNOnSecondCall.calls = 0
    data = with_reward({"type": f"{__name__}:NaNOnSecondCall", "name": "brightness"}, max_steps=3)
    run = train(recipe_from_dict(data), tmp_path / "run", quiet=True)
    log = rows(run)
    assert [r["skipped_steps"] for r in log] == [0, 1, 1]
    assert log[1]["loss"] is None  # NaN is written as null
    weights = load_file(str(run / "checkpoints" / "step_000003" / "weights.safetensors"))
    assert all(bool(torch.isfinite(w).all()) for w in weights.values())


def test_too_many_bad_steps_stop_with_a_message(tmp_path: Path) -> None:
    data = with_reward({"type": f"{__name__}:NaNOnSecondCall", "always": True}, max_steps=10, max_bad_steps=2)
    with pytest.raises(NonFiniteError, match="2 iterations in a row had NaN or inf"):
        train(recipe_from_dict(data), tmp_path / "run", quiet=True)
    assert len(rows(tmp_path / "run")) == 1  # what was written stays


class TrainsNothing(TimestepSelector):
    """A selector that makes step 0 stochastic but trains none of its units."""

    @attrs.frozen
    class Config:
        pass

    def plan(self, schedule: Schedule, iteration: int, generator: torch.Generator) -> Plan:
        return Plan(units=(Unit(0),), trained=())


@pytest.mark.parametrize(
    ("edit", "skipped"),
    [
        (lambda d: d.update(reward=[{"type": f"{__name__}:NaNOnSecondCall", "always": True}]), 3),
        (lambda d: d.update(selector={"type": f"{__name__}:TrainsNothing"}), 0),
    ],
    ids=["every-reward-nan", "no-trained-unit"],
)
def test_a_run_that_trained_nothing_fails(tmp_path: Path, edit: Callable[[dict], None], skipped: int) -> None:
    data = tiny_recipe(max_steps=3)
    edit(data)
    with pytest.raises(NothingTrainedError, match=f"trained nothing: 3 iterations, {skipped} skipped for NaN"):
        train(recipe_from_dict(data), tmp_path / "run", quiet=True)
    assert len(rows(tmp_path / "run")) == 3  # the records of what happened stay
    assert (tmp_path / "run" / "checkpoints" / "step_000003").is_dir()


def test_a_raising_reward_names_itself(tmp_path: Path) -> None:
    data = with_reward({"type": f"{__name__}:Raises", "name": "hps"})
    with pytest.raises(RewardError, match=r"reward 'hps' \(Raises\) failed: RuntimeError: CUDA out of memory"):
        train(recipe_from_dict(data), tmp_path / "run", quiet=True)


def start(recipe: Path, out: Path, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-m", "flowrl.cli.main", "train", str(recipe), "--output-dir", str(out), "--quiet", *extra]
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_rows(run: Path, n: int, proc: subprocess.Popen[str], timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        path = run / "metrics.jsonl"
        if path.exists() and len(path.read_text().splitlines()) >= n:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    raise TimeoutError(f"{run} never reached {n} rows")


@pytest.mark.slow
@pytest.mark.parametrize(("name", "status"), [("SIGTERM", 143), ("SIGHUP", 129), ("SIGINT", 130)])
def test_a_stop_signal_writes_a_checkpoint_and_exits_cleanly(tmp_path: Path, name: str, status: int) -> None:
    """SIGTERM (pre-emption), SIGHUP (a closed terminal: before, it killed the run without a checkpoint) and
    SIGINT are acknowledged at once, then the iteration ends with a checkpoint; exit 128 + the signal."""
    recipe = tmp_path / "r.toml"
    recipe.write_text(recipe_from_dict(tiny_recipe(max_steps=500)).to_toml())
    proc = start(recipe, tmp_path / "run")
    wait_for_rows(tmp_path / "run", 2, proc)
    proc.send_signal(getattr(signal, name))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == status, err  # 128 + the signal: a shell's `train && eval` stops here
    assert f"{name}: stopping after this iteration with a checkpoint" in err
    assert f"{name}: checkpoint written" in err
    step = len(rows(tmp_path / "run"))
    assert (tmp_path / "run" / "checkpoints" / f"step_{step:06d}" / "weights.safetensors").exists()


@pytest.mark.slow
@pytest.mark.parametrize("update", ["recompute", "retain"])
def test_sigkill_and_resume_is_bitwise_identical(tmp_path: Path, update: str) -> None:
    recipe = tmp_path / "r.toml"
    data = tiny_recipe(max_steps=5, checkpoint_every=1, keep_checkpoints=10, update=update)
    recipe.write_text(recipe_from_dict(data).to_toml())
    full = start(recipe, tmp_path / "full")
    assert full.wait(timeout=600) == 0, full.communicate()
    proc = start(recipe, tmp_path / "killed")
    wait_for_rows(tmp_path / "killed", 3, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    resumed = start(recipe, tmp_path / "killed", "--resume", str(tmp_path / "killed"))
    assert resumed.wait(timeout=600) == 0, resumed.communicate()
    a, b = rows(tmp_path / "full"), rows(tmp_path / "killed")
    assert [r["step"] for r in b] == [1, 2, 3, 4, 5]
    assert [r["reward/total"] for r in a] == [r["reward/total"] for r in b]
    assert all(("update/retained_used" in r) == (update == "retain") for r in a + b)  # the mode was in force
    last = "checkpoints/step_000005/weights.safetensors"
    wa, wb = load_file(str(tmp_path / "full" / last)), load_file(str(tmp_path / "killed" / last))
    # exact: a resumed run replays the same batches, draws and optimiser state through the same arithmetic
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_a_second_writer_is_refused_while_the_lock_is_held(tmp_path: Path) -> None:
    held = lock_run_folder(tmp_path / "run")
    assert held is not None
    with pytest.raises(RunFolderError, match=rf"run folder .*run is in use by flowrl train \(pid {os.getpid()}\)"):
        lock_run_folder(tmp_path / "run")
    held.close()  # released: the next writer may go on
    again = lock_run_folder(tmp_path / "run")
    assert again is not None
    again.close()


def test_two_trainings_started_at_once_leave_one_runs_records(tmp_path: Path) -> None:
    recipes = []
    for seed in (0, 1):
        recipe = tmp_path / f"seed{seed}.toml"
        data = tiny_recipe(max_steps=2)
        data["seed"] = seed
        recipe.write_text(recipe_from_dict(data).to_toml())
        recipes.append(recipe)
    procs = [start(recipe, tmp_path / "run") for recipe in recipes]
    results = [(proc.wait(timeout=600), proc.communicate()[1]) for proc in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    loser = next(err for code, err in results if code == 2)
    assert "is in use by flowrl train" in loser or "already holds a run" in loser, loser
    winner = next(i for i, (code, _) in enumerate(results) if code == 0)
    assert [r["step"] for r in rows(tmp_path / "run")] == [1, 2]
    assert f"seed = {winner}\n" in (tmp_path / "run" / "recipe.toml").read_text()


def test_resume_drops_a_torn_last_metrics_line(tmp_path: Path) -> None:
    data = tiny_recipe(max_steps=2, checkpoint_every=1, keep_checkpoints=5)
    train(recipe_from_dict(data), tmp_path / "run", quiet=True)
    path = tmp_path / "run" / "metrics.jsonl"
    with path.open("a") as f:
        f.write('{"step": 3, "wall_s": 1.2, "rew')  # a crash in the middle of writing step 3
    data["trainer"]["max_steps"] = 3
    train(recipe_from_dict(data), tmp_path / "run", resume=tmp_path / "run", quiet=True)
    assert [r["step"] for r in rows(tmp_path / "run")] == [1, 2, 3]


def test_a_checkpoint_appears_whole_or_not_at_all(tmp_path: Path) -> None:
    """The recipe, LoRA export and samples are written into the staging folder before its rename: a kill at any
    moment cannot leave a step folder whose recipe.toml is missing or cut (a resume would then refuse it)."""
    from flowrl.trainer.checkpoints.folder import load_checkpoint, save_checkpoint

    folder = tmp_path / "checkpoints" / "step_000001"
    seen: list[bool] = []

    def also(staged: Path) -> None:
        seen.append(folder.exists())
        (staged / "recipe.toml").write_text("name = 'x'\n")

    save_checkpoint(folder, {"w": torch.ones(2)}, {"step": 1}, {"rng": None}, keep=None, also=also)
    assert seen == [False]  # written while the folder was still in staging
    assert (folder / "recipe.toml").read_text() == "name = 'x'\n"
    assert load_checkpoint(folder)[1]["step"] == 1
