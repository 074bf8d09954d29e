"""Evaluation suites: the benchmarks papers report (GenEval, the HPSv2 benchmark, DrawBench, ...) as registered
parts, each a prompt set, a pinned generation protocol, its scorers and its aggregation; ``flowrl suite``
generates, scores and compares checkpoints on them (docs/evaluation.md)."""

from flowrl.suites.interface import Item, Suite
from flowrl.suites.protocol import Protocol

__all__ = ["Item", "Protocol", "Suite"]
