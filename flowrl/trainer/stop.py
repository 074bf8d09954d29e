"""Stopping a run by a signal: the current iteration ends, a checkpoint is written, the loop returns."""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any


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
