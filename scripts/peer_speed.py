"""flowrl's Flow-GRPO beside the official Flow-GRPO trainer, doing the same work on the same tiny SD3 model.

    python scripts/peer_speed.py --flow-grpo ~/src/flow_grpo                 # every setting, 4 rounds
    python scripts/peer_speed.py --flow-grpo ~/src/flow_grpo -s lora32 -r 8  # one setting, 8 rounds
    python scripts/peer_speed.py --flow-grpo ~/src/flow_grpo --markdown      # the tables docs/performance.md shows

On a CPU the default settings are the CPU ones; on a CUDA machine, the ~1B-parameter ``sd3_1b_cuda``
(``scripts/gpu_check.py --flow-grpo PATH`` runs it after its own cases).

``--flow-grpo`` is a local clone of https://github.com/yifan123/flow_grpo; nothing of it is copied into flowrl.
Its trainer (``scripts/train_sd3.py``) runs unchanged from the clone; the few things changed in memory at run
time are listed by ``--patches`` (scripts/peer_probe.py). It needs ``absl-py`` and ``ml_collections`` besides
what flowrl installs (``pip install absl-py ml_collections``).

The same work on both sides, per setting (:data:`SETTINGS`): a tiny random-weight SD3 pipeline saved with
``save_pretrained`` (CLIP length 77, T5 length 128 as the official code encodes), the same prompts (words in the
tiny tokenizer's vocabulary), the resolution, the number of steps on the pipeline's own sigma grid (shift 3),
CFG 4.5, groups of ``group`` images for ``prompts`` prompts, every step an SDE step (noise level 0.7), the
first ``int(0.99 * steps)`` trained, JPEG compressibility as the reward, group-normalised advantages with the
global std, PPO clip 1e-4, no KL, LoRA rank 32 / alpha 64 on the official trainer's eight projections (or full
fine-tuning), AdamW (lr 3e-4, weight decay 1e-4), gradient norm clipped at 1, one optimizer step per
iteration, float32, one torch thread. flowrl runs four times: with its default update (``auto``), with
``trainer.update = "recompute"``, with ``retain`` and ``trainer.gradient_checkpointing`` (the kept graphs
are the blocks' inputs; the backward runs each block's forward again), and memory-matched: its default update
under ``trainer.memory_budget`` equal to the peak the official trainer's latest run measured (whole graphs
while they fit, checkpointed ones past that). ``--side`` picks some of them.

Each round runs every side once in a fresh process, in an order that alternates between rounds, so load on
the machine falls on all sides alike. Printed per setting: seconds per iteration (mean over a run's timed
iterations, then the mean over rounds), the official / flowrl ratio with its range over rounds, transformer
rows per iteration with and without gradient, peak resident memory during the timed iterations, and where the
time goes; then per setting the speed ratio at the official trainer's memory (the memory-matched side) and the
memory ratio at its speed (the least memory of a flowrl side at least as fast).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OFFICIAL_LORA = ("attn.add_k_proj", "attn.add_q_proj", "attn.add_v_proj", "attn.to_add_out", "attn.to_k",
                 "attn.to_out.0", "attn.to_q", "attn.to_v")
SIDES = ("official", "flowrl", "flowrl_recompute", "flowrl_checkpointed", "flowrl_budget")
# flowrl's overrides for each of its sides (its default update; recompute; retain with gradient checkpointing)
OVERRIDES = {"flowrl": [], "flowrl_recompute": ["trainer.update=recompute"],
             "flowrl_checkpointed": ["trainer.update=retain", "trainer.gradient_checkpointing=true"],
             "flowrl_budget": []}  # + trainer.memory_budget: the official run's peak (run_side's ``budget_mb``)
# name -> resolution, steps, prompts per iteration, group size, LoRA (False: full fine-tuning), model sizes
SETTINGS: dict[str, dict[str, Any]] = {
    "lora32": {"resolution": 32, "steps": 10, "prompts": 2, "group": 4, "lora": True, "model": {}},
    "full32": {"resolution": 32, "steps": 10, "prompts": 2, "group": 4, "lora": False, "model": {}},
    "lora32_20steps": {"resolution": 32, "steps": 20, "prompts": 2, "group": 4, "lora": True, "model": {}},
    "lora64_wider": {"resolution": 64, "steps": 10, "prompts": 2, "group": 4, "lora": True,
                     "model": {"num_layers": 4, "attention_head_dim": 16, "pos_embed_max_size": 32}},
    # CUDA only (scripts/gpu_check.py --flow-grpo): a ~1B-parameter SD3 transformer (24 joint blocks, width 1024)
    # with the tiny text encoders and VAE, 128 px (1,024 image tokens), groups of 8; float32 weights with TF32
    # matmuls on both sides (the official trainer keeps the LoRA run's transformer in float32 and turns TF32 on)
    "sd3_1b_cuda": {"resolution": 128, "steps": 10, "prompts": 2, "group": 8, "lora": True, "cuda": True,
                    "model": {"num_layers": 24, "attention_head_dim": 64, "num_attention_heads": 16,
                              "pos_embed_max_size": 32}},
}
COLOURS = ("red", "blue", "green", "yellow", "white", "black", "purple", "orange")
THINGS = ("cat", "dog", "car", "house", "tree", "bird", "boat", "chair", "apple", "clock")
PLACES = ("on a table", "in a field", "by the sea", "under a bridge", "in the snow", "at night")


def prompts(n: int) -> list[str]:
    """``n`` distinct prompts over a small vocabulary (every word is in the tiny tokenizer's)."""
    out = [f"a {c} {t} {p}" for p in PLACES for t in THINGS for c in COLOURS]
    return out[:: max(1, len(out) // n)][:n]


def prepare(name: str, setting: dict[str, Any], folder: Path, clone: Path) -> dict[str, Path]:
    """The shared model, the prompt files, the official config file and flowrl's recipe for one setting."""
    from flowrl.backbones.sd3.tiny import TinySD3Spec, save_tiny_sd3

    folder.mkdir(parents=True, exist_ok=True)
    train, test = prompts(64), prompts(64)[:1]
    words = sorted({w for p in train for w in p.split()})
    model = folder / "model"
    spec = TinySD3Spec(image_size=setting["resolution"], max_length=77, **setting["model"])
    save_tiny_sd3(spec, model, words=words)
    data = folder / "prompts"
    data.mkdir(exist_ok=True)
    (data / "train.txt").write_text("\n".join(train) + "\n")
    (data / "test.txt").write_text("\n".join(test) + "\n")
    batch = setting["prompts"] * setting["group"]
    config = folder / "official_config.py"
    config.write_text(OFFICIAL_CONFIG.format(
        base=str(clone / "config" / "base.py"), model=str(model), dataset=str(data), logdir=str(folder / "logs"),
        resolution=setting["resolution"], steps=setting["steps"], group=setting["group"], batch=batch,
        lora=setting["lora"]))
    recipe = folder / "flowrl.toml"
    lora = (f"[lora]\nrank = 32\nalpha = 64.0\ntarget_modules = {json.dumps(list(OFFICIAL_LORA))}\n"
            if setting["lora"] else "")
    recipe.write_text(FLOWRL_RECIPE.format(
        name=name, model=json.dumps(str(model)), train=json.dumps(str(data / "train.txt")),
        test=json.dumps(str(data / "test.txt")), resolution=setting["resolution"], steps=setting["steps"],
        group=setting["group"], prompts=setting["prompts"], batch=batch, lora=lora))
    return {"config": config, "recipe": recipe}


OFFICIAL_CONFIG = '''"""The official trainer's configuration for one setting (written by scripts/peer_speed.py)."""
import importlib.util

_spec = importlib.util.spec_from_file_location("flow_grpo_base", {base!r})
base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(base)


def get_config():
    config = base.get_config()
    config.pretrained.model = {model!r}
    config.dataset = {dataset!r}
    config.logdir = {logdir!r}
    config.save_dir = {logdir!r}
    config.prompt_fn = "general_ocr"  # one prompt per line in train.txt / test.txt
    config.reward_fn = {{"jpeg_compressibility": 1.0}}
    config.mixed_precision = "no"
    config.use_lora = {lora}
    config.resolution = {resolution}
    config.eval_freq = 10 ** 9  # evaluates once, at epoch 0, before the first (warm-up) iteration
    config.save_freq = 10 ** 9
    config.per_prompt_stat_tracking = True
    sample = config.sample
    sample.num_steps = {steps}
    sample.eval_num_steps = 1
    sample.guidance_scale = 4.5
    sample.noise_level = 0.7
    sample.train_batch_size = {batch}
    sample.num_image_per_prompt = {group}
    sample.num_batches_per_epoch = 1
    sample.test_batch_size = 1
    sample.global_std = True
    train = config.train
    train.batch_size = {batch}
    train.gradient_accumulation_steps = 1
    train.num_inner_epochs = 1
    train.timestep_fraction = 0.99
    train.beta = 0.0
    train.ema = False
    train.cfg = True
    train.clip_range = 1e-4
    train.adv_clip_max = 5
    train.learning_rate = 3e-4
    train.adam_weight_decay = 1e-4
    train.max_grad_norm = 1.0
    return config
'''

FLOWRL_RECIPE = """# flowrl's side of one peer_speed setting (written by scripts/peer_speed.py)
name = "peer_{name}"
seed = 42

[backbone]
type = "sd3"
path = {model}
resolution = {resolution}
guidance_scale = 4.5
max_sequence_length = 128
grid = "diffusers"
dtype = "float32"

[prompts]
type = "text_file"
path = {train}
heldout_path = {test}

[schedule]
num_steps = {steps}
shift = 3.0

[selector]
type = "flow_grpo_prefix"
train_fraction = 0.99

[sampler]
type = "independent"
group_size = {group}

[kernel]
type = "flow_grpo_sde"
noise_level = 0.7

[advantage]
type = "group_norm"
eps = 1e-4
global_std = true
clip = 5.0

[[reward]]
type = "jpeg_compressibility"

[loss]
type = "ppo_clip"
clip_range = 1e-4

{lora}
[optim]
lr = 3e-4
weight_decay = 1e-4
max_grad_norm = 1.0

[trainer]
max_steps = 1000
prompts_per_step = {prompts}
train_batch_size = {batch}
mixed_precision = "no"
eval_every = 0
checkpoint_every = 0
image_every = 0
keep_best = ""
torch_threads = 1
"""


def run_side(side: str, paths: dict[str, Path], clone: Path, iterations: int, work: Path,
             budget_mb: float | None = None) -> dict[str, Any]:
    """One fresh process of ``side``; its figures (scripts/peer_probe.py). ``budget_mb``: the memory budget of
    the memory-matched side."""
    work.mkdir(parents=True, exist_ok=True)
    job: dict[str, Any] = {"side": "official" if side == "official" else "flowrl", "iterations": iterations,
                           "out": str(work / "figures.json"), "tf32": True}
    if side == "official":
        job.update(clone=str(clone), config=str(paths["config"]))
    else:
        budget = [f"trainer.memory_budget={int(budget_mb * 2**20)}"] if side == "flowrl_budget" and budget_mb else []
        job.update(recipe=str(paths["recipe"]), run_dir=str(work / "run"), overrides=[*OVERRIDES[side], *budget])
    (work / "job.json").write_text(json.dumps(job))
    env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(ROOT)}
    import os

    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "peer_probe.py"), str(work / "job.json")],
                          env={**os.environ, **env}, capture_output=True, text=True)
    (work / "log.txt").write_text(done.stdout + done.stderr)
    if done.returncode != 0 or not (work / "figures.json").is_file():
        tail = (done.stderr or done.stdout).strip().splitlines()[-15:]
        raise SystemExit(f"peer_speed: the {side} side failed (exit {done.returncode}); its log: "
                         f"{work / 'log.txt'}\n" + "\n".join(tail))
    return dict(json.loads((work / "figures.json").read_text()))


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Means over rounds of one side's per-run means."""
    per_run = [statistics.fmean(it["seconds"] for it in r["iterations"]) for r in runs]
    phases = {p: statistics.fmean(statistics.fmean(it["phases"][p] for it in r["iterations"]) for r in runs)
              for p in runs[0]["iterations"][0]["phases"]}
    rows = {k: statistics.fmean(statistics.fmean(it["rows"][k] for it in r["iterations"]) for r in runs)
            for k in ("grad", "no_grad")}
    return {"s": statistics.fmean(per_run), "per_run": per_run, "phases": phases, "rows": rows,
            "peak_mb": statistics.fmean(r["peak_mb"] for r in runs), "update": runs[0].get("update", "")}


def ratios(official: dict[str, Any], other: dict[str, Any]) -> tuple[float, float, float]:
    """official / other seconds per iteration: the ratio of the means, and the lowest and highest round."""
    per = [a / b for a, b in zip(official["per_run"], other["per_run"], strict=True)]
    return official["s"] / other["s"], min(per), max(per)


def tables(results: dict[str, dict[str, Any]]) -> str:
    lines = ["| setting | side | s / iteration | official / this | rows with gradient | rows without | peak memory"
             " (MB) | official / this (memory) |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, sides in results.items():
        for side, s in sides.items():
            label = side if side == "official" else f"{side} ({s['update']})"
            ratio, low, high = ratios(sides["official"], s)
            speed = "1" if side == "official" else f"{ratio:.2f}x ({low:.2f}-{high:.2f})"
            memory = "1" if side == "official" else f"{sides['official']['peak_mb'] / s['peak_mb']:.2f}x"
            lines.append(f"| {name} | {label} | {s['s']:.2f} | {speed} | {s['rows']['grad']:.0f} |"
                         f" {s['rows']['no_grad']:.0f} | {s['peak_mb']:.0f} | {memory} |")
    lines += ["", "Seconds per iteration by phase (means over rounds):", "",
              "| setting | side | " + " | ".join(PHASE_NAMES.values()) + " | other |",
              "| --- | --- |" + " ---: |" * (len(PHASE_NAMES) + 1)]
    for name, sides in results.items():
        for side, s in sides.items():
            other = s["s"] - sum(s["phases"].values())
            cells = " | ".join(f"{s['phases'][p]:.3f}" for p in PHASE_NAMES)
            lines.append(f"| {name} | {side} | {cells} | {other:.3f} |")
    lines += ["", "At equal memory and at equal speed:", "",
              "| setting | official peak (MB) | memory-matched flowrl: peak (MB), official / this (speed) |"
              " least memory of a flowrl side as fast as the official trainer: side, peak (MB), official / this"
              " (memory) |", "| --- | ---: | --- | --- |"]
    for name, sides in results.items():
        official = sides["official"]
        matched = "not run"
        if "flowrl_budget" in sides:
            b = sides["flowrl_budget"]
            ratio, low, high = ratios(official, b)
            matched = f"{b['peak_mb']:.0f}, {ratio:.2f}x ({low:.2f}-{high:.2f})"
        fast = [(s["peak_mb"], side) for side, s in sides.items() if side != "official" and s["s"] <= official["s"]]
        least = "none"
        if fast:
            peak, side = min(fast)
            least = f"{side}, {peak:.0f}, {official['peak_mb'] / peak:.2f}x"
        lines.append(f"| {name} | {official['peak_mb']:.0f} | {matched} | {least} |")
    return "\n".join(lines)


PHASE_NAMES = {"rollout_transformer": "transformer, no gradient", "update_transformer": "transformer, gradient",
               "backward": "backward", "optimizer": "AdamW", "vae_decode": "VAE decode",
               "text_encoders": "text encoders", "reward": "reward", "image_files": "image files"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--flow-grpo", type=Path, help="a local clone of yifan123/flow_grpo")
    parser.add_argument("-s", "--setting", action="append", choices=sorted(SETTINGS), help="default: every one")
    parser.add_argument("--side", action="append", choices=SIDES[1:], help="flowrl's sides to run beside the"
                        " official trainer (default: every one)")
    parser.add_argument("-r", "--rounds", type=int, default=4, help="runs of each side per setting (default 4)")
    parser.add_argument("-n", "--iterations", type=int, default=3, help="timed iterations per run (default 3)")
    parser.add_argument("--json", type=Path, help="also write every run's figures to this file")
    parser.add_argument("--work", type=Path, help="keep the models, configs and every run's log here (default: a"
                        " temporary folder, removed at the end)")
    parser.add_argument("--markdown", action="store_true", help="print only the tables")
    parser.add_argument("--patches", action="store_true", help="list what is changed in the official code, and exit")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT / "scripts"))
    from peer_probe import OFFICIAL_PATCHES

    if args.patches:
        print("\n".join(f"- {p}" for p in OFFICIAL_PATCHES))
        return 0
    clone = args.flow_grpo
    if clone is None or not (clone / "scripts" / "train_sd3.py").is_file():
        print(f"peer_speed: --flow-grpo {clone}: not a clone of yifan123/flow_grpo (no scripts/train_sd3.py)",
              file=sys.stderr)
        return 2
    missing = [m for m in ("absl", "ml_collections") if importlib_missing(m)]
    if missing:
        print(f"peer_speed: the official trainer needs {' and '.join(missing)}: pip install absl-py ml_collections",
              file=sys.stderr)
        return 2
    if args.rounds < 1 or args.iterations < 1:
        parser.error("--rounds and --iterations must be at least 1")
    import torch

    names = args.setting or [n for n, s in SETTINGS.items() if s.get("cuda", False) == torch.cuda.is_available()]
    if any(SETTINGS[n].get("cuda") for n in names) and not torch.cuda.is_available():
        print("peer_speed: the *_cuda settings need a CUDA device", file=sys.stderr)
        return 2
    sides = ("official", *(args.side or SIDES[1:]))
    results: dict[str, dict[str, Any]] = {}
    raw: dict[str, dict[str, list[dict[str, Any]]]] = {}
    with tempfile.TemporaryDirectory(prefix="peer_speed_") as scratch:
        tmp = str(args.work or scratch)
        for name in names:
            paths = prepare(name, SETTINGS[name], Path(tmp) / name, clone.resolve())
            runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
            for k in range(args.rounds):
                order = sides if k % 2 == 0 else sides[::-1]
                for side in order:
                    # the memory-matched side's budget: the latest official run's peak (round 1 runs it first)
                    budget = runs["official"][-1]["peak_mb"] if runs["official"] else None
                    runs[side].append(run_side(side, paths, clone.resolve(), args.iterations,
                                               Path(tmp) / name / f"{side}_{k}", budget))
                if not args.markdown:
                    last = {side: runs[side][-1] for side in sides}
                    s = {side: statistics.fmean(i["seconds"] for i in r["iterations"]) for side, r in last.items()}
                    print(f"{name} round {k + 1}/{args.rounds}: " + ", ".join(f"{side} {v:.2f} s/it"
                                                                            for side, v in s.items()), flush=True)
            results[name] = {side: summarise(r) for side, r in runs.items()}
            raw[name] = runs
    if args.json:
        args.json.write_text(json.dumps({"settings": {n: SETTINGS[n] for n in names}, "runs": raw}, indent=1))
    print(tables(results))
    return 0


def importlib_missing(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is None


if __name__ == "__main__":
    sys.exit(main())
