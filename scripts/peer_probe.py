"""One side of scripts/peer_speed.py, run in a process of its own: the official Flow-GRPO trainer or flowrl's.

    python scripts/peer_probe.py JOB.json      # written by peer_speed.py; the figures go to JOB.json's "out"

Both sides get the same probes, installed on the library classes before either trainer builds anything, so
one yardstick measures both: the time and the rows of every ``SD3Transformer2DModel.forward`` (with and
without gradient), every ``AutoencoderKL.decode``, every CLIP / T5 text-encoder forward, every
``Tensor.backward``, every ``AdamW.step``, the reward calls, and every image written to a file. An iteration
runs from one prompt draw to the next (the official trainer: ``DistributedKRepeatSampler.set_epoch``; flowrl:
``Trainer.iteration``). The first iteration is a warm-up and is left out; the peak resident memory of the
timed iterations is read from ``/proc/self/status`` (``VmHWM``, reset after the warm-up).

What runs of the official code is its own ``scripts/train_sd3.py`` from the clone, unchanged on disk. What this
process changes at run time, and only in memory, is :data:`OFFICIAL_PATCHES`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
import time
import types
from collections import defaultdict
from pathlib import Path
from typing import Any

OFFICIAL_PATCHES = (
    "wandb: a stand-in module whose calls do nothing (no account, no network; the trainer's own JPEG writes for "
    "its logged images still happen)",
    "train_sd3.DistributedKRepeatSampler.set_epoch: also marks an iteration's start, and ends the run "
    "(SystemExit 0) once the warm-up and the timed iterations are done (the trainer loops forever)",
    "flow_grpo.rewards.multi_score: the reward function it returns is timed (it is called unchanged)",
)

PHASES = ("rollout_transformer", "update_transformer", "backward", "optimizer", "vae_decode", "text_encoders",
          "reward", "image_files")


class Probe:
    """Seconds per phase and transformer rows (with / without gradient) since the last :meth:`cut`."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.rows = {"grad": 0, "no_grad": 0}
        self.depth = 0  # nested timed calls count once, in the outermost phase
        self.iterations: list[dict[str, Any]] = []
        self.mark = time.perf_counter()

    def timed(self, phase: str | None, fn: Any) -> Any:
        probe = self

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            name = phase or ("update_transformer" if _grad() else "rollout_transformer")
            if probe.depth:
                return fn(*args, **kwargs)
            probe.depth += 1
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                probe.seconds[name] += time.perf_counter() - start
                probe.depth -= 1

        return wrapper

    def cut(self) -> None:
        """Close the current iteration (from the last mark to now) and start the next."""
        now = time.perf_counter()
        phases = {p: self.seconds.get(p, 0.0) for p in PHASES}
        self.iterations.append({"seconds": now - self.mark, "phases": phases, "rows": dict(self.rows)})
        self.seconds.clear()
        self.rows = {"grad": 0, "no_grad": 0}
        self.mark = now


def _grad() -> bool:
    import torch

    return torch.is_grad_enabled()


def install(probe: Probe) -> None:
    """Wrap the library classes both trainers use (class attributes, so every instance is measured)."""
    import torch
    from diffusers import AutoencoderKL, SD3Transformer2DModel
    from PIL import Image
    from transformers import CLIPTextModelWithProjection, T5EncoderModel

    forward = SD3Transformer2DModel.forward

    def counted(self: Any, hidden_states: Any = None, *args: Any, **kwargs: Any) -> Any:
        probe.rows["grad" if _grad() else "no_grad"] += int(hidden_states.shape[0])
        return forward(self, hidden_states, *args, **kwargs)

    SD3Transformer2DModel.forward = probe.timed(None, counted)  # type: ignore[method-assign]
    AutoencoderKL.decode = probe.timed("vae_decode", AutoencoderKL.decode)  # type: ignore[method-assign]
    for cls in (CLIPTextModelWithProjection, T5EncoderModel):
        cls.forward = probe.timed("text_encoders", cls.forward)  # type: ignore[method-assign]
    torch.Tensor.backward = probe.timed("backward", torch.Tensor.backward)  # type: ignore[method-assign]
    torch.optim.AdamW.step = probe.timed("optimizer", torch.optim.AdamW.step)  # type: ignore[method-assign]
    save = Image.Image.save

    def image_save(self: Any, fp: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(fp, (str, os.PathLike)):  # files; in-memory buffers are the JPEG reward's own work
            return probe.timed("image_files", save)(self, fp, *args, **kwargs)
        return save(self, fp, *args, **kwargs)

    Image.Image.save = image_save  # type: ignore[method-assign]


def peak_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def reset_peak() -> None:
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := the current resident size (Linux)


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def finish(job: dict[str, Any], probe: Probe, extra: dict[str, Any]) -> None:
    timed = probe.iterations[1:]  # the first is the warm-up (and, officially, the evaluation before it)
    Path(job["out"]).write_text(json.dumps({"iterations": timed, "peak_mb": peak_mb(), **extra}))


def run_official(job: dict[str, Any], probe: Probe) -> None:
    clone = Path(job["clone"])
    sys.path.insert(0, str(clone))
    os.chdir(clone)
    stand_in = types.ModuleType("wandb")
    stand_in.init = stand_in.log = lambda *a, **k: None  # type: ignore[attr-defined]
    stand_in.Image = lambda *a, **k: None  # type: ignore[attr-defined]
    sys.modules["wandb"] = stand_in
    import flow_grpo.rewards as rewards

    multi_score = rewards.multi_score
    rewards.multi_score = lambda *a, **k: probe.timed("reward", multi_score(*a, **k))  # type: ignore[assignment]
    spec = importlib.util.spec_from_file_location("train_sd3", clone / "scripts" / "train_sd3.py")
    assert spec is not None and spec.loader is not None
    trainer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(trainer)
    set_epoch = trainer.DistributedKRepeatSampler.set_epoch
    total = job["iterations"] + 1

    def marked(self: Any, epoch: int) -> None:
        if probe.iterations or epoch > 0:
            probe.cut()
        else:  # the first draw: what came before (loading, evaluation at epoch 0) is not an iteration
            probe.seconds.clear()
            probe.rows = {"grad": 0, "no_grad": 0}
            probe.mark = time.perf_counter()
        if len(probe.iterations) == 1:
            reset_peak()
        if len(probe.iterations) == total:
            finish(job, probe, {"patches": list(OFFICIAL_PATCHES)})
            raise SystemExit(0)
        set_epoch(self, epoch)

    trainer.DistributedKRepeatSampler.set_epoch = marked
    from absl import app

    app.run(trainer.main, argv=["train_sd3.py", f"--config={job['config']}"])


def run_flowrl(job: dict[str, Any], probe: Probe) -> None:
    from flowrl.config.recipe import load_recipe
    from flowrl.config.update_modes import resolve_update
    from flowrl.trainer.loop import Trainer

    recipe = load_recipe(Path(job["recipe"]), job.get("overrides", []))
    trainer = Trainer(recipe, Path(job["run_dir"]), quiet=True)
    try:
        probe.mark = time.perf_counter()
        probe.seconds.clear()
        for _ in range(job["iterations"] + 1):
            trainer.iteration()
            probe.cut()
            if len(probe.iterations) == 1:
                reset_peak()
        finish(job, probe, {"update": resolve_update(recipe)})
    finally:
        trainer.logger.close()
        trainer.release()


def main(argv: list[str]) -> int:
    job = json.loads(Path(argv[0]).read_text())
    import torch

    torch.set_num_threads(1)
    if job.get("tf32") and torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = True  # as the official trainer's allow_tf32 (default on) does
    probe = Probe()
    install(probe)
    (run_official if job["side"] == "official" else run_flowrl)(job, probe)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
