"""The sampler's word on which of its transformer calls are never trained inputs.

A sampler knows which of its forwards the update will differentiate (the SDE steps it records) and which it
never will (the deterministic tails after an exploration step, probes). It marks the latter with
:func:`untrained_forwards`; whatever wants to know (the recompute-free update, :mod:`flowrl.trainer.retain`,
keeps no graph for them) asks :func:`forwards_untrained`. An unmarked call costs memory there, never correctness.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_untrained: ContextVar[bool] = ContextVar("flowrl_untrained_forwards", default=False)


@contextmanager
def untrained_forwards() -> Iterator[None]:
    """Transformer calls inside this context are never trained inputs (ODE tails, probes)."""
    token = _untrained.set(True)
    try:
        yield
    finally:
        _untrained.reset(token)


def forwards_untrained() -> bool:
    """Whether the current transformer call is inside :func:`untrained_forwards`."""
    return _untrained.get()
