"""The bench's input errors."""


class BenchError(Exception):
    """A mistake in the bench's input (seeds, budget, reference, metric, run folders): one line, exit 2."""
