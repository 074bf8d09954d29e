"""The trainer's errors that mean "stop and tell the user" (the command line prints them on one line, status 2),
and the interruption that makes ``flowrl train`` exit 130, 143 or 129."""

from __future__ import annotations

from flowrl.core.errors import UserError

__all__ = [
    "BestMetricError",
    "LaunchError",
    "NonFiniteError",
    "NothingTrainedError",
    "RunFolderError",
    "RunInterrupted",
]


class NonFiniteError(UserError, RuntimeError):
    """Too many consecutive iterations produced NaN or inf."""


class NothingTrainedError(UserError, RuntimeError):
    """Every iteration of the run was skipped or had no transition to train: the weights never changed."""


class RunInterrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP stopped the run after its checkpoint (``signal``: the signal's name)."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(signal_name)
        self.signal = signal_name


class RunFolderError(UserError, ValueError):
    """The output folder already holds a run that a fresh run would overwrite, or another process uses it."""


class BestMetricError(UserError, ValueError):
    """``trainer.keep_best`` names a figure the run's evaluation does not report."""


class LaunchError(UserError, ValueError):
    """The run was launched in a way flowrl does not support (accelerate's FSDP or DeepSpeed plugins)."""
