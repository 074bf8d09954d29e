"""Sharded training (``trainer.sharding = "fsdp"``: torch FSDP2 over two gloo CPU processes) on the tiny FLUX
pipeline equals one unsharded process with the same global batch, survives SIGKILL and resume exactly, and
exports a LoRA that a fresh diffusers pipeline loads and samples with."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import ROOT, tiny_recipe
from safetensors.torch import load_file
from served import free_port

from flowrl.backbones.lora.export import LORA_FOLDER
from flowrl.config.recipe import recipe_from_dict

pytestmark = pytest.mark.slow

LAUNCH = ["launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no"]


@pytest.fixture(scope="module")
def flux(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The backbone table of a tiny random FLUX pipeline saved in the diffusers layout."""
    from flowrl.backbones.flux.tiny import TinyFluxSpec, save_tiny_flux

    folder = tmp_path_factory.mktemp("flux")
    save_tiny_flux(TinyFluxSpec(image_size=16, pixel_space=False, num_layers=2, num_single_layers=2), folder)
    return {"type": "flux", "path": str(folder), "resolution": 16, "max_sequence_length": 16, "dtype": "float32"}


def write(
    path: Path, flux: dict[str, Any], per: int, sharding: str, lora: bool, lr: float = 1e-4, **trainer: Any
) -> Path:
    data = tiny_recipe(prompts_per_step=per, sharding=sharding, ema_decay=0.9, **trainer)
    data["backbone"] = flux
    data["advantage"] = {"type": "group_norm", "global_std": True}
    data["optim"] = {"lr": lr}
    if lora:
        data["lora"] = {"rank": 4, "alpha": 8.0}
    path.write_text(recipe_from_dict(data).to_toml())
    return path


def command(recipe: Path, out: str, processes: int, *extra: str) -> list[str]:
    if processes == 2:
        head = [str(Path(sys.executable).parent / "accelerate"), *LAUNCH, "--dynamo_backend", "no", "-m"]
    else:
        head = [sys.executable, "-m"]
    return [*head, "flowrl.cli.main", "train", str(recipe), "--output-dir", out, "--quiet", *extra]


def start(args: list[str], cwd: Path, **env_extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), **env_extra}
    return subprocess.Popen(
        args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def run(args: list[str], cwd: Path) -> None:
    proc = start(args, cwd)
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-2000:] + err[-4000:]


def kill_tree(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the launcher and every process under it (torch's agent starts the workers in their own sessions),
    with no chance to write anything."""
    import psutil  # accelerate's dependency

    launcher = psutil.Process(proc.pid)
    for process in [*launcher.children(recursive=True), launcher]:
        process.send_signal(signal.SIGKILL)


def two_nodes(recipe: Path, out: str, cwd: Path) -> None:
    """`flowrl launch -- train RECIPE` as node 0 and node 1 of two on 127.0.0.1 (gloo), two processes each; the run
    folder is shared, each node has its own scratch folder (TMPDIR, HF_HOME), as on a cluster."""
    port = str(free_port())
    nodes = []
    for rank in (0, 1):
        scratch = cwd / f"scratch_{rank}"
        scratch.mkdir()
        nodes.append(start([sys.executable, "-m", "flowrl.cli.main", "launch", "--nnodes", "2", "--node-rank",
                            str(rank), "--nproc-per-node", "2", "--master-port", port, "--", "train", str(recipe),
                            "--output-dir", out, "--quiet"], cwd, TMPDIR=str(scratch), HF_HOME=str(scratch / "hf")))
    outs = [node.communicate(timeout=900) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], [out[1][-3000:] for out in outs]


def rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_two_sharded_processes_equal_one(flux: dict[str, Any], lora: bool, tmp_path: Path) -> None:
    # with LoRA also a held-out evaluation and sample grids each iteration: sharded, every process joins them
    images = {"eval_every": 1, "image_every": 1} if lora else {}
    run(command(write(tmp_path / "two.toml", flux, 1, "fsdp", lora, max_steps=2, **images), "two", 2), tmp_path)
    run(command(write(tmp_path / "one.toml", flux, 2, "none", lora, max_steps=2, **images), "one", 1), tmp_path)
    one, two = rows(tmp_path / "one"), rows(tmp_path / "two")
    assert len(one) == len(two) == 2 + bool(lora)  # the initial evaluation is row 0
    if lora:
        assert math.isclose(one[-1]["eval/score"], two[-1]["eval/score"], rel_tol=1e-5)
        assert (tmp_path / "two" / "samples" / "step_000002.png").exists()
        assert (tmp_path / "two" / "checkpoints" / "step_000002" / "samples.png").exists()
        one, two = one[1:], two[1:]
    # Not bitwise: a process runs half the rows (other GEMM shapes) and gradients are reduce-scattered; measured
    # differences ~1e-7 relative. Rewards, advantages and the gradient norm (0.002-0.9) at rel 1e-5; the loss, a
    # mean of order-1 terms that cancel to ~1e-9, at abs 1e-6. The KL to the initial policy is a mean of squared
    # differences of two velocities that differ by ~1e-4 of their size after two small steps, so float32 rounding
    # of the velocities (6e-8 of their size) moves it by up to ~1e-3 relative (measured 2e-5).
    for a, b in zip(one, two, strict=True):
        assert a["nfe"] == b["nfe"]
        for key in ("reward/total", "advantage/abs_mean", "grad_norm"):
            assert math.isclose(a[key], b[key], rel_tol=1e-5), (key, a[key], b[key])
        assert abs(a["loss"] - b["loss"]) <= 1e-6, ("loss", a["loss"], b["loss"])
        assert ("health/kl_initial" in a) == ("health/kl_initial" in b)
        if "health/kl_initial" in a:
            assert math.isclose(a["health/kl_initial"], b["health/kl_initial"], rel_tol=1e-3)
    w1 = load_file(str(tmp_path / "one/checkpoints/step_000002/weights.safetensors"))
    w2 = load_file(str(tmp_path / "two/checkpoints/step_000002/weights.safetensors"))
    assert w1.keys() == w2.keys() and all(w1[k].shape == w2[k].shape for k in w1)  # gathered to full tensors
    assert max(float((w1[k] - w2[k]).abs().max()) for k in w1) <= 1e-6
    # The state really is sharded: each process's Adam moments hold a part of each matrix, together all of it.
    shards = [torch.load(tmp_path / f"two/checkpoints/step_000002/shard_{r:03d}.pt") for r in (0, 1)]
    moments = [[s["exp_avg"] for s in shard["optimizer"]["state"].values()] for shard in shards]
    sizes = [sum(m.numel() for m in ms) for ms in moments]
    assert sizes[0] + sizes[1] == sum(w.numel() for w in w1.values())
    assert 0 < sizes[1] < sizes[0] + sizes[1]
    ema = [sum(t.numel() for t in shard["ema"].values()) for shard in shards]
    assert ema == sizes
    if lora:
        exported = f"checkpoints/step_000002/{LORA_FOLDER}/pytorch_lora_weights.safetensors"
        l1, l2 = load_file(str(tmp_path / "one" / exported)), load_file(str(tmp_path / "two" / exported))
        assert l1.keys() == l2.keys() and max(float((l1[k] - l2[k]).abs().max()) for k in l1) <= 1e-6


def test_sharded_sigkill_and_resume_is_exact_and_the_lora_loads_into_diffusers(
    flux: dict[str, Any], tmp_path: Path
) -> None:
    # lr 1e-2: a LoRA that visibly changes the samples (the last assertion)
    trainer = {"max_steps": 4, "checkpoint_every": 1, "keep_checkpoints": 10}
    recipe = write(tmp_path / "r.toml", flux, 1, "fsdp", True, 1e-2, **trainer)
    run(command(recipe, "full", 2), tmp_path)
    proc = start(command(recipe, "killed", 2), tmp_path)
    first = tmp_path / "killed" / "checkpoints" / "step_000001"
    deadline = time.time() + 600
    while not first.exists():  # complete checkpoints appear by a rename
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.05)
    kill_tree(proc)
    proc.wait(timeout=60)
    written = sorted(p.name for p in (tmp_path / "killed" / "checkpoints").glob("step_??????"))
    assert written and written[-1] != "step_000004", written  # killed before the end
    run(command(recipe, "killed", 2, "--resume", "killed"), tmp_path)
    a, b = rows(tmp_path / "full"), rows(tmp_path / "killed")
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    assert [r["reward/total"] for r in a] == [r["reward/total"] for r in b]
    last = "checkpoints/step_000004/weights.safetensors"
    wa, wb = load_file(str(tmp_path / "full" / last)), load_file(str(tmp_path / "killed" / last))
    # exact: the resumed processes replay the same batches, draws, shards and optimizer slices
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    _lora_reproduces_flowrl_samples(tmp_path / "killed", Path(flux["path"]))


def _lora_reproduces_flowrl_samples(run_dir: Path, base: Path) -> None:
    from diffusers import FluxPipeline

    from flowrl.core.types import Plan, Schedule
    from flowrl.export.loading import load_policy
    from flowrl.parts.samplers.walk import walk

    policy = load_policy(run_dir)  # one process, no sharding: the checkpoint's gathered weights
    backbone, prompts, steps = policy.backbone, ["a red circle", "two blue squares"], 4
    schedule = Schedule(backbone.schedule_sigmas(steps, 3.0), policy.schedule.kernel)
    x1 = backbone.noise(len(prompts), torch.Generator().manual_seed(3))
    with torch.no_grad():
        ours = walk(backbone, x1, backbone.encode(prompts), torch.arange(2), 0, Plan((), ()), schedule, None)
    fresh = FluxPipeline.from_pretrained(base, local_files_only=True)
    fresh.set_progress_bar_config(disable=True)
    fresh.load_lora_weights(run_dir / "checkpoints" / "step_000004" / LORA_FOLDER)

    def sample() -> torch.Tensor:
        kwargs = {"num_inference_steps": steps, "height": 16, "width": 16, "max_sequence_length": 16}
        return fresh(prompt=prompts, latents=x1.clone(), output_type="latent", **kwargs).images  # type: ignore[no-any-return]

    theirs = sample()
    diff = float((ours - theirs).abs().max())
    assert ours.shape == theirs.shape and diff <= 1e-4, diff  # float32 latents of order 1, as the unsharded test
    fresh.unload_lora_weights()
    assert float((ours - sample()).abs().max()) > 100 * max(diff, 1e-6)  # the trained LoRA matters


def test_a_sharded_checkpoint_resumes_with_another_process_count(flux: dict[str, Any], tmp_path: Path) -> None:
    """The slices of 2 processes merge into the full optimizer and EMA state: one process, sharded or not,
    continues the run as the equivalent one-process run would."""
    two = write(tmp_path / "two.toml", flux, 1, "fsdp", False, max_steps=2, checkpoint_every=1, keep_checkpoints=5)
    run(command(two, "two", 2), tmp_path)
    run(command(write(tmp_path / "one.toml", flux, 2, "none", False, max_steps=2), "one", 1), tmp_path)
    final = "checkpoints/step_000002/weights.safetensors"
    expected = load_file(str(tmp_path / "one" / final))
    for sharding in ("none", "fsdp"):
        recipe = write(tmp_path / f"{sharding}.toml", flux, 2, sharding, False, max_steps=2)
        run(command(recipe, sharding, 1, "--resume", "two/checkpoints/step_000001"), tmp_path)
        got = load_file(str(tmp_path / sharding / final))
        # the first step ran on 2 processes: float32 rounding as in the equality test above
        assert max(float((got[k] - expected[k]).abs().max()) for k in expected) <= 1e-6, sharding


@pytest.mark.parametrize("method", ["aegpo", "diffusion_nft"])
def test_sharding_changes_nothing_for_probes_and_forward_process_losses(method: str, tmp_path: Path) -> None:
    """AEGPO's attention-entropy probe (through the sharded blocks, and the sharded frozen reference for its
    entropy baseline) and DiffusionNFT's forward-process loss: 2 sharded processes equal 2 DDP processes (the
    same per-process batches, so only sharding differs)."""
    from conftest import shipped_tiny

    for sharding in ("fsdp", "none"):
        # DiffusionNFT's shipped lagged old policy needs unsharded weights: its levels are kept, the copy is not
        plain = ["loss.old_policy=rollout", "loss.sampler_policy=policy"] if method == "diffusion_nft" else []
        recipe = shipped_tiny(method, [f"trainer.sharding={sharding}", "trainer.prompts_per_step=1", *plain])
        (tmp_path / f"{sharding}.toml").write_text(recipe.to_toml())
        run(command(tmp_path / f"{sharding}.toml", sharding, 2), tmp_path)
    fsdp, ddp = rows(tmp_path / "fsdp"), rows(tmp_path / "none")
    assert len(fsdp) == len(ddp) == 2
    for a, b in zip(ddp, fsdp, strict=True):  # tolerances as above
        assert a["nfe"] == b["nfe"] and a["reward/total"] == b["reward/total"]
        assert math.isclose(a["grad_norm"], b["grad_norm"], rel_tol=1e-5), (a["grad_norm"], b["grad_norm"])
        assert abs(a["loss"] - b["loss"]) <= 1e-6
        probes = [k for k in a if k.startswith("plan/")]
        assert all(math.isclose(a[k], b[k], rel_tol=1e-5, abs_tol=1e-6) for k in probes), probes
    final = "checkpoints/step_000002/weights.safetensors"
    w1, w2 = load_file(str(tmp_path / "none" / final)), load_file(str(tmp_path / "fsdp" / final))
    assert max(float((w1[k] - w2[k]).abs().max()) for k in w1) <= 1e-6


@pytest.mark.parametrize("plugin", ["FSDP", "DEEPSPEED"])
def test_accelerates_own_sharding_plugins_are_refused(plugin: str) -> None:
    from flowrl.trainer.run_errors import LaunchError
    from flowrl.trainer.sharding import check_launch

    check_launch("MULTI_CPU")  # a plain launch passes
    with pytest.raises(LaunchError, match=f'its {plugin} plugin.*trainer.sharding = "fsdp"'):
        check_launch(plugin)


def test_hybrid_sharding_on_two_nodes_of_two_equals_one_process(flux: dict[str, Any], tmp_path: Path) -> None:
    """trainer.sharding = "hybrid" on two loopback nodes of two processes (flowrl launch): each node shards one copy
    (every process holds half of each Adam moment), the nodes replicate it; the run equals one unsharded process
    with the same global batch, and one process resumes its checkpoint from the first node's slices."""
    hybrid = write(tmp_path / "hybrid.toml", flux, 1, "hybrid", False, max_steps=2, checkpoint_every=1,
                   keep_checkpoints=5)
    two_nodes(hybrid, "hybrid", tmp_path)
    one = write(tmp_path / "one.toml", flux, 4, "none", False, max_steps=2)
    run(command(one, "one", 1), tmp_path)
    for a, b in zip(rows(tmp_path / "one"), rows(tmp_path / "hybrid"), strict=True):  # tolerances as above
        assert a["nfe"] == b["nfe"]
        for key in ("reward/total", "advantage/abs_mean", "grad_norm"):
            assert math.isclose(a[key], b[key], rel_tol=1e-5), (key, a[key], b[key])
    final = "checkpoints/step_000002"
    expected = load_file(str(tmp_path / "one" / final / "weights.safetensors"))
    got = load_file(str(tmp_path / "hybrid" / final / "weights.safetensors"))
    assert max(float((got[k] - expected[k]).abs().max()) for k in expected) <= 1e-6
    state = json.loads((tmp_path / "hybrid" / final / "trainer_state.json").read_text())
    assert (state["sharded_processes"], state["shard_group"]) == (4, 2)
    shards = [torch.load(tmp_path / "hybrid" / final / f"shard_{r:03d}.pt") for r in range(4)]
    sizes = [sum(m["exp_avg"].numel() for m in shard["optimizer"]["state"].values()) for shard in shards]
    total = sum(w.numel() for w in expected.values())
    assert sizes[0] + sizes[1] == total and sizes[0] == sizes[2] and sizes[1] == sizes[3] and 0 < sizes[1] < total
    run(command(one, "resumed", 1, "--resume", "hybrid/checkpoints/step_000001"), tmp_path)
    resumed = load_file(str(tmp_path / "resumed" / final / "weights.safetensors"))
    assert max(float((resumed[k] - expected[k]).abs().max()) for k in expected) <= 1e-6


@pytest.mark.parametrize(("sharding", "lora"), [("none", False), ("none", True), ("fsdp", False), ("fsdp", True)],
                         ids=["ddp-full", "ddp-lora", "fsdp-full", "fsdp-lora"])
def test_two_nodes_of_two_equal_one_process(flux: dict[str, Any], sharding: str, lora: bool, tmp_path: Path) -> None:
    """DDP and FSDP2 (sharded over all 4 processes), full fine-tuning and LoRA, on two loopback nodes of two
    processes each: the run equals one unsharded process with the same global batch; the shared run folder holds
    the files one process writes (each written once, by the global main; a sharded checkpoint adds one slice per
    process) and nothing lands in a node's scratch folder. Sharded, one node of 4 processes resumes the two-node
    checkpoint as the one-process run continues."""
    nodes = write(tmp_path / "nodes.toml", flux, 1, sharding, lora, max_steps=2, checkpoint_every=1,
                  keep_checkpoints=5)
    two_nodes(nodes, "nodes", tmp_path)
    one = write(tmp_path / "one.toml", flux, 4, "none", lora, max_steps=2, checkpoint_every=1, keep_checkpoints=5)
    run(command(one, "one", 1), tmp_path)
    for a, b in zip(rows(tmp_path / "one"), rows(tmp_path / "nodes"), strict=True):  # tolerances as above
        assert a["nfe"] == b["nfe"]
        for key in ("reward/total", "advantage/abs_mean", "grad_norm"):
            assert math.isclose(a[key], b[key], rel_tol=1e-5), (key, a[key], b[key])
        assert abs(a["loss"] - b["loss"]) <= 1e-6, ("loss", a["loss"], b["loss"])
    final = "checkpoints/step_000002/weights.safetensors"
    expected = load_file(str(tmp_path / "one" / final))
    got = load_file(str(tmp_path / "nodes" / final))
    assert expected.keys() == got.keys() and max(float((got[k] - expected[k]).abs().max()) for k in expected) <= 1e-6

    def files(run_dir: Path) -> set[str]:  # TensorBoard's file names carry the host and process id: left out
        return {str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file() and "events" not in p.name}

    slices = {f"checkpoints/step_{s:06d}/shard_{r:03d}.pt" for s in (1, 2) for r in range(4)}
    assert files(tmp_path / "nodes") == files(tmp_path / "one") | (slices if sharding == "fsdp" else set())
    assert len(list((tmp_path / "nodes" / "tb").glob("events*"))) == 1  # one TensorBoard writer, the global main
    assert not [p for rank in (0, 1) for p in (tmp_path / f"scratch_{rank}").rglob("*")]
    if sharding == "fsdp":
        port = str(free_port())
        run([sys.executable, "-m", "flowrl.cli.main", "launch", "--nproc-per-node", "4", "--master-port", port, "--",
             "train", str(nodes), "--output-dir", "four", "--quiet", "--resume", "nodes/checkpoints/step_000001"],
            tmp_path)
        resumed = load_file(str(tmp_path / "four" / final))
        assert max(float((resumed[k] - expected[k]).abs().max()) for k in expected) <= 1e-6
