"""The collectives the loop makes with several processes: gathering a tensor from every process, the logged
scalars' means (NFE: sums) over processes, and a stop signal that any process received. The advantage phase's
use of them is :mod:`flowrl.trainer.advantage`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def gather(accelerator: Any, value: Tensor) -> Tensor:
    """All processes' tensors concatenated along dim 0, in process order (same length on each)."""
    if accelerator.num_processes == 1:
        return value
    return accelerator.gather(value.to(accelerator.device)).cpu()  # type: ignore[no-any-return]


def reduce_metrics(accelerator: Any, metrics: dict[str, Any], summed: tuple[str, ...] = ()) -> dict[str, Any]:
    """Mean over processes of every numeric metric (sum for the keys in ``summed``)."""
    if accelerator.num_processes == 1:
        return metrics
    keys = [k for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)]
    values = torch.tensor([float(metrics[k]) for k in keys], dtype=torch.float64, device=accelerator.device)
    total = accelerator.reduce(values, reduction="sum").cpu()
    out = dict(metrics)
    for k, v in zip(keys, total.tolist(), strict=True):
        out[k] = v if k in summed else v / accelerator.num_processes
        if isinstance(metrics[k], int) and k in summed:
            out[k] = int(round(out[k]))
    return out


def shared_stop(accelerator: Any, received: str) -> str:
    """The stop signal (``"SIGTERM"``, ...) that any process received, ``""`` for none: a scheduler may signal one
    node's processes only, and every process must leave the loop at the same iteration (the checkpoint is a
    collective). Several signals: the highest-numbered."""
    import signal

    if accelerator.num_processes == 1:
        return received
    number = float(signal.Signals[received].value) if received else 0.0
    top = accelerator.reduce(torch.tensor([number], dtype=torch.float64, device=accelerator.device), reduction="max")
    return signal.Signals(int(top.item())).name if top.item() > 0 else ""
