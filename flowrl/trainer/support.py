"""Small pieces the loop uses: signals, seeding, attention kernels, plan diagnostics."""

from __future__ import annotations

import random
import signal
import sys
import threading
from typing import Any

import numpy as np
import torch

from flowrl.types import Plan


def allow_attention_kernels(which: str) -> None:
    """Restrict torch's CUDA scaled-dot-product-attention kernels (``trainer.attention_kernels``)."""
    if which == "auto":
        return
    cuda = torch.backends.cuda
    cuda.enable_cudnn_sdp(False)
    if which != "no-cudnn":
        cuda.enable_flash_sdp(which == "flash")
        cuda.enable_mem_efficient_sdp(which == "efficient")
        cuda.enable_math_sdp(which == "math")


class StopSignal:
    """SIGINT, SIGTERM and SIGHUP (a closed terminal or ssh session) end the current iteration, then the loop saves
    a checkpoint and returns; the first signal is acknowledged at once, a second one stops at once."""

    SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))

    def __init__(self) -> None:
        self.received = ""
        self.previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self.previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        if self.received:  # a second signal: stop now
            raise KeyboardInterrupt
        self.received = signal.Signals(signum).name
        try:  # after SIGHUP the terminal may be gone
            sys.stderr.write(f"\n{self.received}: stopping after this iteration with a checkpoint (send it again to "
                             "stop at once, without one)\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def plan_scalars(plan: Plan) -> dict[str, float]:
    """The numeric entries of ``plan.info`` (a selector's or allocator's diagnostics) as ``plan/<key>``;
    lists of numbers are summarised by their mean, min and max."""
    out: dict[str, float] = {}
    for key, value in plan.info.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[f"plan/{key}"] = float(value)
        elif isinstance(value, list | tuple) and value and all(isinstance(v, int | float) for v in value):
            numbers = [float(v) for v in value]
            out.update({f"plan/{key}/mean": sum(numbers) / len(numbers), f"plan/{key}/max": max(numbers)})
            out[f"plan/{key}/min"] = min(numbers)
    return out


def peak_memory_mb() -> float:
    """Peak memory so far: the GPU allocator's peak on CUDA, else the process's peak resident set."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
