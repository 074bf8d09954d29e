"""The bench's input errors."""

from flowrl.core.errors import UserError


class BenchError(UserError):
    """A mistake in the bench's input (seeds, budget, reference, metric, run folders): one line, exit 2."""
