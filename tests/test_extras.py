"""A method's own per-rollout data (Rollout.extras) with no core edit: a made-up method in
tests/plugins/madeup_method.py attaches a field, and it survives the two-process gather and a resume."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
from pathlib import Path

import attrs
import pytest
import torch
from conftest import ROOT, tiny_recipe
from safetensors.torch import load_file

from flowrl.config.recipe import recipe_from_dict
from flowrl.core.extras import Extra, Gather, PerRollout, RolloutIds, unique_ids
from flowrl.trainer import train

PLUGINS = ROOT / "tests" / "plugins"


def madeup(**trainer: object) -> dict:
    data = tiny_recipe(**trainer)
    data["sampler"]["type"] = "madeup_method:BrightnessSampler"
    data["advantage"] = {"type": "madeup_method:BrightnessBaseline", "weight": 5.0}
    data["reward"] = [{"type": "jpeg_compressibility", "scale_kb": 1.0}]
    return data


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def two_processes(extra: Extra, twin: Extra) -> list[Extra]:
    """What ``gathered`` gives on each of two processes holding ``extra`` and ``twin`` (threads as processes)."""
    barrier, slots = threading.Barrier(2), [torch.empty(0), torch.empty(0)]
    out: list[Extra] = [extra, twin]

    def run(rank: int) -> None:
        def gather(value: torch.Tensor) -> torch.Tensor:
            slots[rank] = value
            barrier.wait()
            joined = torch.cat(slots)
            barrier.wait()
            return joined

        out[rank] = out[rank].gathered(gather, 2)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return out


def test_the_declared_rules_join_processes_in_order() -> None:
    a, b = torch.tensor([0, 2, 1]), torch.tensor([1, 0, 0])  # each process's local ids
    for got in two_processes(RolloutIds(a), RolloutIds(b)):  # process 1's ids shifted past max + 1 = 3
        assert isinstance(got, RolloutIds) and got.value.tolist() == [0, 2, 1, 4, 3, 3]
    for got in two_processes(PerRollout(a.double()), PerRollout(b.double())):
        assert isinstance(got, PerRollout) and torch.equal(got.value, torch.cat([a, b]).double())
    parents = two_processes(Parents(torch.tensor([-1, 0, 0])), Parents(torch.tensor([-1, 0, 1])))
    assert all(isinstance(p, Parents) and p.value.tolist() == [-1, 0, 0, -1, 3, 4] for p in parents)


@attrs.frozen
class Parents(Extra):
    """A rule written outside the core: node ids of a fixed node count per process, -1 for none."""

    value: torch.Tensor

    def gathered(self, gather: Gather, processes: int) -> Parents:
        return Parents(unique_ids(gather, self.value, processes, per_process=self.value.shape[0]))


def test_a_method_field_survives_a_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(PLUGINS))
    recipe = recipe_from_dict(madeup(max_steps=4, checkpoint_every=1, keep_checkpoints=10))
    train(recipe, tmp_path / "full", quiet=True)
    train(recipe, tmp_path / "resumed", resume=tmp_path / "full" / "checkpoints" / "step_000002", quiet=True)
    a, b = rows(tmp_path / "full"), rows(tmp_path / "resumed")
    assert [r["step"] for r in b][-2:] == [3, 4]
    assert [r["advantage/abs_mean"] for r in a[2:]] == [r["advantage/abs_mean"] for r in b[-2:]]
    last = "checkpoints/step_000004/weights.safetensors"
    wa, wb = load_file(str(tmp_path / "full" / last)), load_file(str(tmp_path / "resumed" / last))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)  # exact: the same arithmetic replayed


@pytest.mark.slow
def test_a_method_field_survives_the_two_process_gather(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(PLUGINS))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), str(PLUGINS)])}
    bin_dir = Path(sys.executable).parent
    launch = [str(bin_dir / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1"]
    launch += ["--mixed_precision", "no", "--dynamo_backend", "no", "-m", "flowrl.cli.main"]
    one = [sys.executable, "-m", "flowrl.cli.main"]
    for name, command, prompts in (("two", launch, 1), ("one", one, 2)):
        recipe = tmp_path / f"{name}.toml"
        recipe.write_text(recipe_from_dict(madeup(max_steps=3, prompts_per_step=prompts)).to_toml())
        args = [*command, "train", str(recipe), "--output-dir", name, "--quiet"]
        out = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    a, b = rows(tmp_path / "one"), rows(tmp_path / "two")
    assert len(a) == len(b) == 3
    # rel 1e-5 as in test_distributed (other GEMM shapes per process: ~1e-7 relative).
    for x, y in zip(a, b, strict=True):
        for key in ("reward/total", "advantage/abs_mean", "grad_norm"):
            assert math.isclose(x[key], y[key], rel_tol=1e-5), (key, x[key], y[key])
