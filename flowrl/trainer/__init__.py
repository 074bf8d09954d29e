"""The shared trainer: one loop for every method."""

from flowrl.trainer.loop import Trainer, train

__all__ = ["Trainer", "train"]
