"""Figures of served rewards on this machine, printed (docs/rewards.md and docs/performance.md quote them).

    python scripts/served_reward_figures.py load      # requests/s and latency of `flowrl serve world_verifier`
    python scripts/served_reward_figures.py overlap   # iteration time with and without trainer.overlap_chunks

``load``: a real `flowrl serve world_verifier` process on a free 127.0.0.1 port; C client threads send
``/score`` requests of B rendered 32 px scenes (PNG) for a fixed time; prints requests/s, images/s and the
latency percentiles. ``overlap``: recipes/flow_grpo_remote.toml (its world model) for a few iterations against a
server whose reward (:class:`Delayed`) sleeps a fixed time per image, with overlap_chunks 0 and K; prints the
mean iteration time of each and their ratio. Everything stops by itself.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import torch

from flowrl.core.interfaces import RewardModel

ROOT = Path(__file__).resolve().parents[1]


class Delayed(RewardModel):
    """A test reward for timing: each image's mean pixel value, after ``delay_s`` seconds per image."""

    @attrs.frozen
    class Config:
        delay_s: float = 0.02

    def score(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        time.sleep(self.config.delay_s * images.shape[0])
        return images.float().mean(dim=(1, 2, 3))


@contextlib.contextmanager
def server(reward: str, *settings: str) -> Iterator[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "scripts")}
    env.pop("FLOWRL_SERVE_TOKEN", None)
    args = [sys.executable, "-m", "flowrl.cli.main", "serve", reward, "--port", "0", "--quiet"]
    for item in settings:
        args += ["--set", item]
    process = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    try:
        line = process.stdout.readline() if process.stdout else ""
        if " at " not in line:
            raise SystemExit(f"the server did not start: {line!r}")
        yield line.strip().rsplit(" at ", 1)[1]
    finally:
        process.terminate()
        process.wait(30)


def load(seconds: float, batch: int, clients: tuple[int, ...]) -> None:
    from flowrl.world.grammar import enumerate_scenes
    from flowrl.world.render import render_batch

    scenes = enumerate_scenes("train")[: 7 * batch : 7]
    images = torch.from_numpy(render_batch(scenes, 0)).permute(0, 3, 1, 2).float() / 255
    prompts = [s.text for s in scenes]
    with server("world_verifier") as url:
        for count in clients:
            print(json.dumps(measure(url, images, prompts, count, seconds)), flush=True)


def measure(url: str, images: torch.Tensor, prompts: list[str], count: int, seconds: float) -> dict:
    """``count`` client threads scoring ``images`` for ``seconds``: requests/s, images/s, latency percentiles."""
    from flowrl.rewards.remote import RemoteReward

    latencies: list[float] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def client() -> None:
        reward = RemoteReward(RemoteReward.Config(url=url, batch_size=len(prompts), retries=0))
        while time.monotonic() < stop:
            start = time.perf_counter()
            reward.score(images, prompts)
            with lock:
                latencies.append(time.perf_counter() - start)

    threads = [threading.Thread(target=client) for _ in range(count)]
    begin = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - begin
    ms = sorted(1000 * v for v in latencies)

    def p(q: float) -> float:
        return round(ms[min(len(ms) - 1, int(q * len(ms)))], 1)

    return {"clients": count, "batch": len(prompts), "requests": len(ms),
            "requests_per_s": round(len(ms) / elapsed, 1), "images_per_s": round(len(ms) * len(prompts) / elapsed, 1),
            "latency_ms": {"p50": p(0.5), "p95": p(0.95), "mean": round(statistics.fmean(ms), 1)}}


def overlap(steps: int, chunks: int, delay_s: float) -> None:
    from flowrl.config.recipe import load_recipe
    from flowrl.trainer import train

    torch.set_num_threads(1)
    with server("served_reward_figures:Delayed", f"delay_s={delay_s}") as url:
        times = {}
        for k in (0, chunks):
            recipe = load_recipe(ROOT / "recipes" / "flow_grpo_remote.toml", [
                f"reward.url={json.dumps(url)}", "reward.expect=''", f"trainer.max_steps={steps}",
                "trainer.eval_every=0", "trainer.image_every=0", "trainer.checkpoint_every=0", "trainer.kl_every=0",
                "trainer.max_minutes=0", f"trainer.overlap_chunks={k}"])
            with tempfile.TemporaryDirectory() as folder:
                run = train(recipe, Path(folder) / "run", quiet=True)
                rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
            per = [b["wall_s"] - a["wall_s"] for a, b in zip(rows, rows[1:], strict=False)]  # the first: warm-up
            times[k] = statistics.fmean(per)
            print(json.dumps({"overlap_chunks": k, "iteration_s": round(times[k], 3),
                              "rollout_s": round(statistics.fmean(r["time/rollout_s"] for r in rows[1:]), 3)}),
                  flush=True)
        images = recipe.trainer.prompts_per_step * int(recipe.parts["sampler"].config.group_size)
        print(json.dumps({"delay_per_image_s": delay_s, "images_per_iteration": images,
                          "ratio_without_over_with": round(times[0] / times[chunks], 3)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("load", "overlap"))
    parser.add_argument("--seconds", type=float, default=10.0, help="load: time per client count")
    parser.add_argument("--batch", type=int, default=8, help="load: images per request")
    parser.add_argument("--clients", default="1,4", help="load: client thread counts")
    parser.add_argument("--steps", type=int, default=4, help="overlap: iterations per setting")
    parser.add_argument("--chunks", type=int, default=4, help="overlap: trainer.overlap_chunks to compare with 0")
    parser.add_argument("--delay", type=float, default=0.02, help="overlap: the reward's seconds per image")
    args = parser.parse_args()
    if args.what == "load":
        load(args.seconds, args.batch, tuple(int(c) for c in args.clients.split(",")))
    else:
        overlap(args.steps, args.chunks, args.delay)


if __name__ == "__main__":
    main()
