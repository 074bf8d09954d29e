"""A checkpoint of an iteration's start, written when a served reward stops answering mid-iteration, or a
user-written part (a reward, a selector) fails before the update.

When the rewards are asked for, the iteration has not changed the weights, the optimizer or the loop's counters
yet, but it has moved the random streams and the parts' state (a selector's window) while planning and rolling
out. :class:`RestartPoint` keeps those as they were when the iteration began (a few kilobytes); rewinding to it
before saving makes the checkpoint the one the previous iteration would have written, so ``--resume`` runs the
failed step again, exactly, once the server is back: no step lost, none counted twice.

Single process: in a multi-process run the process whose server failed would save alone while the others wait
in the next collective, so there the error stops the run without this checkpoint (the periodic ones remain).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from flowrl.core.errors import PartError
from flowrl.core.interfaces import Component
from flowrl.rewards.http import RewardServerUnavailable
from flowrl.trainer.checkpoints.folder import rng_state, set_rng_state


class RestartPoint:
    """The random streams and every part's state at the start of the current iteration; ``save`` writes a step
    checkpoint from the loop's counters (flowrl.trainer.checkpoints.saving.RunCheckpoints.save)."""

    def __init__(self, parts: dict[str, Component], save: Callable[[dict[str, Any]], Path | None],
                 processes: int) -> None:
        self.parts, self.save, self.processes = parts, save, processes
        self.rng: dict[str, Any] | None = None
        self.states: dict[str, Any] = {}

    def mark(self) -> None:
        """Remember the state now (the start of an iteration)."""
        self.rng = rng_state({})
        self.states = {name: copy.deepcopy(part.state_dict()) for name, part in self.parts.items()}

    def rewind(self) -> None:
        """Put back what :meth:`mark` remembered."""
        if self.rng is None:
            raise RuntimeError("RestartPoint.rewind() before mark()")
        set_rng_state(self.rng, {})
        for name, part in self.parts.items():
            part.load_state_dict(self.states[name])

    @contextmanager
    def guard(self, counters: Callable[[], dict[str, Any]]) -> Iterator[None]:
        """Around one iteration (``counters``: the loop's progress, as a checkpoint keeps it). When a part fails
        before the iteration's update (the step counter unchanged): a reward server that stops answering, or a
        user-written reward or selector that raises, exits or returns what it must not, rewind, write the
        checkpoint of the iteration's start and stop with the part's error naming the checkpoint, so that
        ``--resume`` runs the iteration again once the server is back or the part mended."""
        self.mark()
        step = counters()["step"]
        try:
            yield
        except PartError as error:
            if counters()["step"] != step or self.processes > 1:
                raise
            self.rewind()
            folder = self.save(counters())
            then = "once the server answers" if server_down(error) else "once the part is mended"
            raise type(error)(f"{error}; checkpoint {folder} holds step {step}: {then}, continue with --resume") \
                from (error.__cause__ or error)  # the part's own exception: its traceback is shown


def server_down(error: BaseException) -> bool:
    """Whether ``error`` (or what it was raised from) is a reward server that did not answer."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, RewardServerUnavailable):
            return True
        seen = seen.__cause__
    return False
