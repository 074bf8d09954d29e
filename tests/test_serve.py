"""`flowrl serve` as a user runs it: a real server process on a free 127.0.0.1 port. The shipped remote recipe trains
to the same rewards as the in-process one; a server killed mid-run stops the run with a checkpoint that resumes
the same step once it is back; several trainer processes share one server; refusals leave it serving."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, tiny_recipe
from safetensors.torch import load_file
from served import free_port, serve_process, tiny_world

from flowrl.cli.main import main
from flowrl.cli.serve import listening_socket
from flowrl.config.recipe import load_recipe, recipe_from_dict
from flowrl.config.tomlwrite import dumps
from flowrl.core.interfaces import RewardError
from flowrl.rewards.remote import RemoteReward
from flowrl.trainer import train
from flowrl.world.components import WorldVerifier

WORLD_RUN = ["trainer.max_steps=2", "trainer.prompts_per_step=2", "sampler.group_size=4", "trainer.eval_every=2",
             "trainer.eval_prompts=8", "trainer.image_every=0", "trainer.checkpoint_every=0", "trainer.max_minutes=0"]


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_serve_refuses_bad_arguments_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "world_verifyer"]) == 2
    assert "unknown reward type 'world_verifyer'; did you mean 'world_verifier'?" in capsys.readouterr().err
    assert main(["serve", "world_verifier", "--set", "strictly=true"]) == 2
    assert "strictly" in capsys.readouterr().err
    taken = listening_socket("127.0.0.1", 0)
    port = taken.getsockname()[1]
    try:
        assert main(["serve", "world_verifier", "--port", str(port)]) == 2
    finally:
        taken.close()
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


@pytest.mark.slow
def test_flow_grpo_remote_trains_to_the_same_rewards_as_in_process(tmp_path: Path) -> None:
    """recipes/flow_grpo_remote.toml against `flowrl serve world_verifier`: the same rewards and evaluation figures
    as recipes/flow_grpo.toml, exactly (float32 images: the verifier sees the very tensors; it is deterministic)."""
    here = train(load_recipe(ROOT / "recipes" / "flow_grpo.toml", WORLD_RUN), tmp_path / "here", quiet=True)
    with serve_process("world_verifier") as server:
        overrides = [*WORLD_RUN, f"reward.url={json.dumps(server.url)}"]
        assert main(["validate", str(ROOT / "recipes" / "flow_grpo_remote.toml"), "--set", overrides[-1]]) == 0
        served = train(load_recipe(ROOT / "recipes" / "flow_grpo_remote.toml", overrides), tmp_path / "remote",
                       quiet=True)
        images, prompts = tiny_world()
        remote = RemoteReward(RemoteReward.Config(url=server.url, encoding="float32"))
        assert torch.equal(remote.score(images, prompts), WorldVerifier(WorldVerifier.Config()).score(images, prompts))
    a, b = metrics(here), metrics(served)
    keys = ["reward/world_verifier", "reward/total", "eval/score", "eval/strict", "eval/objects"]
    assert [[r.get(k) for k in keys] for r in a] == [[r.get(k) for k in keys] for r in b]
    assert any(r.get("eval/score") is not None for r in b) and len(b) == 3  # step 0 and 2 evaluated, 2 steps


def brightness_recipe(url: str, steps: int) -> dict:
    data = tiny_recipe(max_steps=steps, eval_every=0)
    data["reward"] = [{"name": "brightness", "type": "remote", "url": url, "encoding": "float32", "retries": 1,
                       "backoff_s": 0.05, "timeout_s": 10.0}]
    return data


@pytest.mark.slow
def test_a_killed_server_stops_the_run_and_resume_continues_the_same_step(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    local = tiny_recipe(max_steps=3, eval_every=0)
    local["reward"] = [{"name": "brightness", "type": "served:Brightness"}]
    here = train(recipe_from_dict(local), tmp_path / "here", quiet=True)
    run = tmp_path / "remote"
    with serve_process("served:Brightness", "stop_after=2", port=port) as server:  # the 3rd request kills it
        with pytest.raises(RewardError, match=f"reward server {url}/score did not answer") as caught:
            train(recipe_from_dict(brightness_recipe(url, 3)), run, quiet=True)
        server.process.wait(10)
        assert server.process.returncode == 3  # it died in the middle of a request
    assert "holds step 2" in str(caught.value)
    with serve_process("served:Brightness", port=port):
        train(recipe_from_dict(brightness_recipe(url, 3)), run, resume=run, quiet=True)
    assert [r["reward/total"] for r in metrics(here)] == [r["reward/total"] for r in metrics(run)]
    wa = load_file(str(here / "checkpoints" / "step_000003" / "weights.safetensors"))
    wb = load_file(str(run / "checkpoints" / "step_000003" / "weights.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.slow
def test_several_trainer_processes_share_one_server(tmp_path: Path) -> None:
    """Three `flowrl train` processes at once on one slow server (5 ms an image): all finish with the rewards of
    the same recipe scored in process; a fourth without the token is refused (401, exit 2)."""
    local = tiny_recipe(max_steps=3, eval_every=0)
    local["reward"] = [{"name": "brightness", "type": "served:Brightness"}]
    here = train(recipe_from_dict(local), tmp_path / "here", quiet=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "tests"),
           "FLOWRL_SERVE_TOKEN": "t0ken"}
    with serve_process("served:Brightness", "delay_s=0.005", token="t0ken") as server:
        recipe = tmp_path / "remote.toml"
        recipe.write_text(dumps(brightness_recipe(server.url, 3)))
        runs = [tmp_path / f"run{i}" for i in range(3)]
        trainers = [subprocess.Popen([sys.executable, "-m", "flowrl.cli.main", "train", str(recipe), "--output-dir",
                                      str(run), "--quiet"], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True) for run in runs]
        results = [t.communicate(timeout=600) for t in trainers]
        refused = subprocess.run([sys.executable, "-m", "flowrl.cli.main", "train", str(recipe), "--output-dir",
                                  str(tmp_path / "refused")], env={**env, "FLOWRL_SERVE_TOKEN": ""}, cwd=ROOT,
                                 capture_output=True, text=True, timeout=600)
        assert server.process.poll() is None  # still serving
    assert all(t.returncode == 0 for t in trainers), [r[1][-800:] for r in results]
    expected = [r["reward/total"] for r in metrics(here)]
    assert all([r["reward/total"] for r in metrics(run)] == expected for run in runs)
    assert refused.returncode == 2 and "HTTP 401" in refused.stderr and "Traceback" not in refused.stderr


def test_the_access_log_is_shown_unless_quiet() -> None:
    """--help said --quiet turns the access log off, but it was never shown (uvicorn's INFO under warning)."""
    import urllib.request

    from served import serve_process

    for quiet in (False, True):
        with serve_process("world_verifier", quiet=quiet) as served:
            urllib.request.urlopen(f"{served.url}/health", timeout=30).read()
            served.process.terminate()
            out, err = served.process.communicate(timeout=30)
        assert ('"GET /health HTTP/1.1" 200' in out + err) != quiet, (quiet, out, err)
