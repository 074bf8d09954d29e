"""flowrl launch: the cluster read from the command line and the schedulers' variables (the command line wins,
then torchrun's, accelerate's and SLURM's), malformed values refused in one line, and (slow) two loopback nodes
of one process each training as one process with the same global batch."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, tiny_recipe
from served import free_port

from flowrl.cli.main import main
from flowrl.config.recipe import recipe_from_dict
from flowrl.utils.cluster import ClusterError, first_host, resolve, worker_command, worker_env

NONE = {"nnodes": None, "node_rank": None, "nproc_per_node": None, "master_addr": None, "master_port": None}
SLURM = {"SLURM_JOB_NUM_NODES": "4", "SLURM_NODEID": "2", "SLURM_GPUS_ON_NODE": "8",
         "SLURM_JOB_NODELIST": "gpu[07-09,12]"}


def test_slurm_alone_gives_the_whole_cluster() -> None:
    cluster = resolve(NONE, SLURM, gpus=0)
    assert (cluster.nnodes, cluster.node_rank, cluster.nproc_per_node, cluster.master_addr, cluster.master_port) == (
        4, 2, 8, "gpu07", 29500)
    assert cluster.source == {"nnodes": "SLURM_JOB_NUM_NODES", "node_rank": "SLURM_NODEID",
                              "nproc_per_node": "SLURM_GPUS_ON_NODE", "master_addr": "SLURM_JOB_NODELIST"}
    assert "master_port = 29500 (default)" in cluster.describe()


def test_the_command_line_wins_then_torchrun_then_accelerate_then_slurm() -> None:
    env = {**SLURM, "NUM_MACHINES": "3", "MACHINE_RANK": "1", "MAIN_PROCESS_IP": "10.0.0.5",
           "MAIN_PROCESS_PORT": "6000", "NODE_RANK": "0", "MASTER_PORT": "7000"}
    cluster = resolve({**NONE, "nproc_per_node": 2}, env, gpus=8)
    assert (cluster.nnodes, cluster.node_rank, cluster.nproc_per_node) == (3, 0, 2)  # accelerate, torchrun, given
    assert (cluster.master_addr, cluster.master_port) == ("10.0.0.5", 7000)  # accelerate's address, torchrun's port
    assert cluster.source["nproc_per_node"] == "--nproc-per-node" and cluster.source["node_rank"] == "NODE_RANK"
    assert resolve(NONE, {}, gpus=4).nproc_per_node == 4 and resolve(NONE, {}, gpus=0).nproc_per_node == 1
    assert worker_command("py", ["train", "r.toml"]) == ["py", "-m", "flowrl.cli.main", "train", "r.toml"]
    two = resolve({**NONE, "nnodes": 2, "node_rank": 1, "nproc_per_node": 3}, {"MASTER_ADDR": "h"}, gpus=0)
    assert worker_env(two, 2) == {"RANK": "5", "LOCAL_RANK": "2", "WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "3",
                                  "GROUP_RANK": "1", "NODE_RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "29500"}


@pytest.mark.parametrize(("nodelist", "host"), [("gpu[07-09,12]", "gpu07"), ("node12", "node12"),
                                                ("a,b[1-2]", "a"), ("x[003]", "x003")])
def test_the_first_host_of_a_slurm_node_list(nodelist: str, host: str) -> None:
    assert first_host(nodelist) == host


@pytest.mark.parametrize(("env", "message"), [
    ({"NODE_RANK": "one"}, "NODE_RANK='one': expected a whole number for node_rank"),
    ({"SLURM_GPUS_ON_NODE": "lots"}, "SLURM_GPUS_ON_NODE='lots'"),
    ({"NNODES": "2", "NODE_RANK": "2"}, "node_rank = 2 (NODE_RANK) is not below nnodes = 2 (NNODES)"),
    ({"MASTER_PORT": "70000"}, "MASTER_PORT='70000': expected a port from 1 to 65534"),
])
def test_malformed_variables_are_refused_naming_them(env: dict[str, str], message: str) -> None:
    with pytest.raises(ClusterError, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve(NONE, env, gpus=0)
    assert resolve(NONE, {"SLURM_GPUS_ON_NODE": "gpu:4"}, gpus=0).nproc_per_node == 4  # SLURM's typed form


def test_dry_run_prints_the_command_and_errors_are_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for key, value in SLURM.items():
        monkeypatch.setenv(key, value)
    assert main(["launch", "--dry-run", "--node-rank", "3", "--", "flowrl", "train", "r.toml", "--set", "seed=1"]) == 0
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    assert len(lines) == 8 and lines[7].startswith("RANK=31 LOCAL_RANK=7 WORLD_SIZE=32 LOCAL_WORLD_SIZE=8")
    assert lines[0].endswith("MASTER_ADDR=gpu07 MASTER_PORT=29500 " + sys.executable
                             + " -m flowrl.cli.main train r.toml --set seed=1")
    assert "node_rank = 3 (--node-rank)" in err
    monkeypatch.setenv("SLURM_NODEID", "x")
    assert main(["launch", "--dry-run", "--", "train", "r.toml"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: SLURM_NODEID='x': expected a whole number for node_rank"
    assert main(["launch", "--dry-run", "--", "launch"]) == 2
    assert "give the flowrl command to run after --" in capsys.readouterr().err
    monkeypatch.delenv("SLURM_NODEID")
    assert main(["launch", "--dry-run", "--master-port", "65535", "--", "ls"]) == 2  # the option and the variable
    assert "--master-port: expected a number below 65535" in capsys.readouterr().err
    monkeypatch.setenv("MASTER_PORT", "65535")
    assert main(["launch", "--dry-run", "--", "ls"]) == 2
    assert capsys.readouterr().err.strip().endswith("error: MASTER_PORT='65535': expected a port from 1 to 65534 (the"
                                                    " join check listens on the port above it)")


def join(cwd: Path, nodes: list[tuple[list[str], list[str]]], timeout_s: int = 60) -> list[tuple[int, str, str]]:
    """`flowrl launch --nnodes 2 OPTIONS -- COMMAND` as node 0 and node 1 on 127.0.0.1 (one (OPTIONS, COMMAND) per
    node): each node's exit status, stdout and stderr."""
    port = str(free_port())
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-m", "flowrl.cli.main", "launch", "--nnodes", "2", "--node-rank",
                               str(rank), "--master-port", port, "--join-timeout", "30", *options, "--", *command],
                              cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank, (options, command) in enumerate(nodes)]
    outs = [proc.communicate(timeout=timeout_s) for proc in procs]
    return [(proc.returncode, out, err) for proc, (out, err) in zip(procs, outs, strict=True)]


def test_nodes_that_disagree_end_every_node_with_one_line_naming_what_differs(tmp_path: Path) -> None:
    """Node 0 brings one process, node 1 two (ranks would collide, world sizes disagree): both launchers end at the
    join check, before any process starts, with the same line naming the value and what each node said."""
    nodes = join(tmp_path, [(["--nproc-per-node", "1"], ["ls", "loss"]), (["--nproc-per-node", "2"], ["ls", "loss"])])
    for code, out, err in nodes:
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 2 and not out, err
        assert len(lines) == 2 and lines[0].startswith("flowrl launch: nnodes = 2 (--nnodes)"), err
        assert lines[1].startswith("error: the nodes disagree: nproc_per_node = 1 on node 0 (host ")
        assert ", --nproc-per-node) but 2 on node 1 (host " in lines[1]
    assert nodes[0][2].splitlines()[-1] == nodes[1][2].splitlines()[-1]


def test_nodes_that_agree_run_their_command(tmp_path: Path) -> None:
    nodes = join(tmp_path, [(["--nproc-per-node", "1"], ["ls", "loss"])] * 2)
    assert [code for code, _, _ in nodes] == [0, 0], [err for _, _, err in nodes]
    assert nodes[0][1] == nodes[1][1] and "crd" in nodes[0][1]


def two_nodes(cwd: Path, recipe: str, out: str, env: dict[str, str]) -> list[subprocess.Popen[str]]:
    """`flowrl launch -- train RECIPE` as node 0 and node 1 of two on 127.0.0.1, one process each."""
    port = str(free_port())
    return [subprocess.Popen([sys.executable, "-m", "flowrl.cli.main", "launch", "--nnodes", "2", "--node-rank",
                              str(rank), "--nproc-per-node", "1", "--master-port", port, "--", "train", recipe,
                              "--output-dir", out, "--quiet"], cwd=cwd, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for rank in (0, 1)]


@pytest.mark.slow
def test_two_loopback_nodes_of_one_process_train_as_one_process(tmp_path: Path) -> None:
    """`flowrl launch --nnodes 2 --node-rank 0|1` on 127.0.0.1 (gloo): the same rewards, NFE and gradient norms
    as one process given the same global batch; the shared run folder written once, by the global main."""
    for name, per in (("two.toml", 1), ("one.toml", 2)):
        data = tiny_recipe(max_steps=2, prompts_per_step=per, checkpoint_every=0)
        data["advantage"] = {"type": "group_norm", "global_std": True}
        (tmp_path / name).write_text(recipe_from_dict(data).to_toml())
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    nodes = two_nodes(tmp_path, "two.toml", "two", env)
    outs = ["".join(node.communicate(timeout=600)) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    one = subprocess.run([sys.executable, "-m", "flowrl.cli.main", "train", "one.toml", "--output-dir", "one",
                          "--quiet"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert one.returncode == 0, one.stderr[-3000:]
    rows = {n: [json.loads(line) for line in (tmp_path / n / "metrics.jsonl").read_text().splitlines()]
            for n in ("one", "two")}
    assert len(rows["one"]) == len(rows["two"]) == 2
    for a, b in zip(rows["one"], rows["two"], strict=True):  # tolerances as in tests/test_distributed.py
        assert a["nfe"] == b["nfe"]
        for key in ("reward/total", "advantage/abs_mean", "grad_norm"):
            assert math.isclose(a[key], b[key], rel_tol=1e-5), (key, a[key], b[key])
    assert "node_rank = 1 (--node-rank)" in outs[1]


def test_hybrid_sharding_needs_equal_nodes() -> None:
    from flowrl.trainer.run_errors import LaunchError
    from flowrl.trainer.sharding import shard_group

    assert shard_group(False, 8) == 8 and shard_group(True, 8, 4) == 4 and shard_group(True, 3, 3) == 3
    with pytest.raises(LaunchError, match="6 processes do not split into nodes of 4"):
        shard_group(True, 6, 4)


@pytest.mark.slow
@pytest.mark.parametrize("rank", [0, 1])
def test_a_node_that_never_joins_ends_the_others_with_one_line(rank: int, tmp_path: Path) -> None:
    """Alone, the main node (rank 0) or another (rank 1) gives up after --join-timeout, in one line and exit 2,
    before any training process starts: no hang and no native traceback."""
    import time

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "flowrl.cli.main", "launch", "--nnodes", "2", "--node-rank", str(rank),
                          "--nproc-per-node", "1", "--master-port", str(free_port()), "--join-timeout", "3", "--",
                          "train", "missing.toml"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    took = time.monotonic() - started
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2, out.stderr
    assert len(lines) == 2 and lines[0].startswith("flowrl launch: nnodes = 2") and "Traceback" not in out.stderr
    expected = "only 1 of 2 nodes joined" if rank == 0 else "node 1: cannot reach the main node"
    assert lines[1].startswith("error: " + expected) and "within 3 s" in lines[1], lines[1]
    assert took < 3 * 3 + 10, took  # c10d's client tries twice; start-up is a few seconds
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_sigterm_to_one_node_stops_every_node_with_one_checkpoint(tmp_path: Path) -> None:
    """A scheduler's SIGTERM to one node's launcher: that node's process finishes its iteration, every process of
    every node leaves the loop at the same iteration, one checkpoint is written, and both launchers exit 143;
    one process then resumes the two-node run's checkpoint."""
    import signal
    import time

    data = tiny_recipe(max_steps=500, prompts_per_step=1, checkpoint_every=0)
    (tmp_path / "long.toml").write_text(recipe_from_dict(data).to_toml())
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    nodes = two_nodes(tmp_path, "long.toml", "long", env)
    metrics = tmp_path / "long" / "metrics.jsonl"
    deadline = time.time() + 300
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
        assert time.time() < deadline and all(node.poll() is None for node in nodes), [n.poll() for n in nodes]
        time.sleep(0.1)
    nodes[1].send_signal(signal.SIGTERM)
    outs = [node.communicate(timeout=300) for node in nodes]
    assert [node.returncode for node in nodes] == [143, 143], [err[-2000:] for _, err in outs]
    steps = len(metrics.read_text().splitlines())
    assert sorted(p.name for p in (tmp_path / "long" / "checkpoints").iterdir()) == [f"step_{steps:06d}"]
    assert all(f"SIGTERM: checkpoint written at step {steps}" in err for _, err in outs)
    resumed = subprocess.run([sys.executable, "-m", "flowrl.cli.main", "train", "long.toml", "--resume", "long",
                              "--set", f"trainer.max_steps={steps + 1}", "--quiet"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert len(metrics.read_text().splitlines()) == steps + 1
