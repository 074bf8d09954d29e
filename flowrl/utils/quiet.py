"""Library warnings a flowrl user cannot act on, dropped at their source (and only those).

transformers warns once per image-processor class that torchvision is missing and that it falls back to the
PIL processor: flowrl's rewards preprocess images themselves (flowrl.rewards.preprocess) and the diffusers
pipelines import those classes without using them, so the warning says nothing about a flowrl run. Every
other transformers message passes.
"""

from __future__ import annotations

import logging

NOT_ACTIONABLE = ("requires torchvision (not installed); falling back to",)
SOURCE = "transformers.utils.import_utils"  # the logger transformers emits the fallback warning from


class DropNotActionable(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(text in message for text in NOT_ACTIONABLE)


def install() -> None:
    """Attach the filter to the emitting logger (idempotent; transformers need not be imported yet)."""
    logger = logging.getLogger(SOURCE)
    if not any(isinstance(f, DropNotActionable) for f in logger.filters):
        logger.addFilter(DropNotActionable())
