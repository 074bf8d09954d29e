"""Real reward servers on 127.0.0.1 for the tests: in a thread of the test process (starts in milliseconds) or as a
`flowrl serve` process (what a user runs; seconds to import), and the small rewards the fault tests serve.

Every server listens on a free loopback port and is stopped by the context manager that started it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import attrs
import torch
from conftest import ROOT
from fastapi import FastAPI, Request
from torch import Tensor

from flowrl.core.interfaces import RewardModel


class Brightness(RewardModel):
    """Deterministic test reward: each image's mean pixel value, plus ``offset``; ``delay_s`` of sleep per image;
    the first ``fail_first`` calls raise (the server answers 500); after ``stop_after`` calls it calls
    ``on_stop`` (set by the test) or, in a served process, ends the process (a server that dies mid-run)."""

    @attrs.frozen
    class Config:
        delay_s: float = 0.0  # per image: a model's cost grows with the batch
        fail_first: int = 0
        stop_after: int = 0  # 0: never
        offset: float = 0.0

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.calls = 0
        self.on_stop: Any = None

    def score(self, images: Tensor, prompts: list[str]) -> Tensor:
        self.calls += 1
        if self.config.stop_after and self.calls > self.config.stop_after:
            if self.on_stop is None:
                os._exit(3)  # the server process dies in the middle of a request
            self.on_stop()
            raise RuntimeError("stopping")
        if self.calls <= self.config.fail_first:
            raise RuntimeError(f"failure {self.calls} of {self.config.fail_first}")
        if self.config.delay_s:
            time.sleep(self.config.delay_s * images.shape[0])
        return images.float().mean(dim=(1, 2, 3)) + self.config.offset


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Threaded:
    """A uvicorn server in a thread: ``url``; ``stop()`` ends it (new connections are then refused)."""

    def __init__(self, server: Any, thread: threading.Thread, sock: socket.socket) -> None:
        self.server, self.thread, self.sock = server, thread, sock
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"

    def stop(self) -> None:
        self.server.should_exit = True
        if threading.current_thread() is not self.thread:
            self.thread.join(10)
        self.sock.close()


@contextlib.contextmanager
def in_thread(app: Any, port: int = 0) -> Iterator[Threaded]:
    """Serve an ASGI ``app`` with uvicorn in a daemon thread on ``port`` (0: a free one); stopped on exit."""
    import uvicorn

    from flowrl.cli.serve import listening_socket

    sock = listening_socket("127.0.0.1", port)
    server = uvicorn.Server(uvicorn.Config(app, log_level="critical", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    handle = Threaded(server, thread, sock)
    try:
        yield handle
    finally:
        handle.stop()


@contextlib.contextmanager
def reward_in_thread(reward: RewardModel, name: str = "test", token: str = "",
                     max_body_bytes: int = 1 << 20, port: int = 0) -> Iterator[Threaded]:
    """``flowrl serve``'s application for ``reward``, in a thread."""
    from flowrl.serve.app import create_app

    with in_thread(create_app(reward, name, token=token, max_body_bytes=max_body_bytes), port) as handle:
        yield handle


class Served:
    """A `flowrl serve` process: its URL and the process (``kill()`` it to simulate a crash)."""

    def __init__(self, process: subprocess.Popen[str], url: str) -> None:
        self.process, self.url = process, url

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(10)


@contextlib.contextmanager
def serve_process(reward: str, *settings: str, port: int = 0, token: str = "", quiet: bool = True) -> Iterator[Served]:
    """``flowrl serve REWARD --set ... --port PORT [--quiet]`` as a child process; yields once it listens."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "tests")}
    env.pop("FLOWRL_SERVE_TOKEN", None)
    if token:
        env["FLOWRL_SERVE_TOKEN"] = token
    args = [sys.executable, "-m", "flowrl.cli.main", "serve", reward, "--port", str(port), *(["--quiet"] * quiet)]
    for item in settings:
        args += ["--set", item]
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    try:
        line = process.stdout.readline() if process.stdout else ""
        if " at http://" not in line:
            process.kill()
            raise RuntimeError(f"flowrl serve did not start: {line!r} {process.communicate(timeout=10)[1][-2000:]}")
        yield Served(process, line.strip().rsplit(" at ", 1)[1])
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        for stream in (process.stdout, process.stderr):
            if stream:
                stream.close()


def tiny_world(count: int = 6) -> tuple[Tensor, list[str]]:
    """Rendered embedded-world scenes (the verifier finds what their prompts ask), last one noise."""
    from flowrl.world.grammar import enumerate_scenes
    from flowrl.world.render import render_batch

    scenes = enumerate_scenes("train")[: 50 * count : 50]
    images = torch.from_numpy(render_batch(scenes, 0)).permute(0, 3, 1, 2).float() / 255
    images[-1] = torch.rand(images.shape[1:], generator=torch.Generator().manual_seed(0))
    return images, [s.text for s in scenes]


def judge_answer(text: str, model: str = "judge-7b", digits_apart: bool = False,
                 alternatives: dict[int, dict[str, float]] | None = None) -> dict[str, Any]:
    """An OpenAI chat-completions answer with ``text`` and its tokens' log-probabilities. The tokens are the runs of
    digits (one token per digit with ``digits_apart``, as Qwen's tokenizer writes numbers) and the runs of other
    characters between them; the ``k``-th digit token's alternatives are ``alternatives[k]`` (token -> probability,
    the written token among them), else the token alone with probability 1."""
    import math
    import re

    content, k = [], 0
    for piece in re.findall(r"\d|\D+" if digits_apart else r"\d+|\D+", text):
        top = {piece: 1.0}
        if piece.isdigit():
            top = (alternatives or {}).get(k, top)
            k += 1
        content.append({"token": piece, "logprob": math.log(top[piece]),
                        "top_logprobs": [{"token": t, "logprob": math.log(p)} for t, p in top.items()]})
    choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop",
              "logprobs": {"content": content}}
    return {"id": "x", "object": "chat.completion", "model": model, "choices": [choice]}


def edit_judge_app(semantics: Any, quality: Any, models: tuple[str, ...] = ("judge-7b",)) -> FastAPI:
    """A stand-in for a VLM judge served OpenAI-style (vLLM, SGLang): ``/v1/models`` lists ``models``;
    ``/v1/chat/completions`` answers a question with several images (the semantic-consistency one) with
    ``semantics(body)`` and one with a single image (perceptual quality) with ``quality(body)``, each a
    :func:`judge_answer`; without ``logprobs`` in the request the answer carries none, as a server's. It keeps the
    requests it got (``app.state.seen``)."""
    app = FastAPI()
    app.state.seen = []

    @app.get("/v1/models")
    async def listed() -> dict:
        return {"object": "list", "data": [{"id": m, "object": "model"} for m in models]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict:
        body = await request.json()
        app.state.seen.append(body)
        images = [p for p in body["messages"][0]["content"] if p["type"] == "image_url"]
        answer = (semantics if len(images) > 1 else quality)(body)
        if not body.get("logprobs"):
            answer["choices"][0].pop("logprobs", None)
        return answer

    return app
