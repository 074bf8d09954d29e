"""Gradient checkpointing switched on for single transformer calls (the memory budget of ``retain``).

A diffusers transformer checkpoints its blocks when its modules' ``gradient_checkpointing`` flag is set and
gradients are on; the flag is read at each call. :class:`CheckpointSwitch` sets it for the calls made inside
:meth:`~CheckpointSwitch.on` only, with a checkpoint function that also reports each block input it keeps, so
the caller can count what a checkpointed graph holds (its blocks' inputs, not their activations). The
backward of such a call runs each block's forward again (non-reentrant checkpointing: the autocast and random
states of the call are restored for it), so its gradient is the one the whole graph gives.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint


class CheckpointSwitch:
    """The modules of ``transformer`` that honour a ``gradient_checkpointing`` flag, to switch per call."""

    def __init__(self, transformer: nn.Module) -> None:
        self.modules = [m for m in transformer.modules() if hasattr(m, "gradient_checkpointing")]
        # the run already checkpoints every call (trainer.gradient_checkpointing): nothing to switch
        self.always = any(bool(m.gradient_checkpointing) for m in self.modules)

    @property
    def available(self) -> bool:
        """Whether :meth:`on` changes anything: the transformer has the flag and does not checkpoint already."""
        return bool(self.modules) and not self.always

    @contextmanager
    def on(self, keep: Callable[[Tensor], object]) -> Iterator[None]:
        """Inside, the transformer's blocks run checkpointed; ``keep`` sees every tensor input a block saves."""

        def checkpointed(block: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            for value in (*args, *kwargs.values()):
                if isinstance(value, Tensor):
                    keep(value)
            return checkpoint(block, *args, use_reentrant=False, **kwargs)

        saved = [(m, m.gradient_checkpointing, m.__dict__.get("_gradient_checkpointing_func")) for m in self.modules]
        for m in self.modules:
            m.__dict__["_gradient_checkpointing_func"] = checkpointed  # a plain attribute, as diffusers sets it
            setattr(m, "gradient_checkpointing", True)  # noqa: B010  (a plain flag, not a parameter or module)
        try:
            yield
        finally:
            for m, flag, func in saved:
                setattr(m, "gradient_checkpointing", flag)  # noqa: B010
                if func is None:
                    m.__dict__.pop("_gradient_checkpointing_func", None)
                else:
                    m.__dict__["_gradient_checkpointing_func"] = func
