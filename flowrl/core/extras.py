"""A method's own rollout data, carried by the core without knowing what it is.

A sampler attaches data its method needs later (to the advantage estimator, mostly) to
``Rollout.extras`` under a name of its choosing. Each value is an :class:`Extra`: it declares how the
pieces of several processes join into the global batch the estimator sees, so the trainer gathers every
extra the same way and a new method needs no core change. Two rules cover per-rollout tensors:

- :class:`PerRollout`: one row per rollout (dim 0), joined by concatenation in process order;
- :class:`RolloutIds`: one id per rollout, local to its process (a group, a unit, a parent), made unique
  across processes (process ``k``'s ids shifted past every lower process's).

Anything else (a tree, a graph, a table) subclasses :class:`Extra` and writes its own :meth:`Extra.gathered`
from the ``gather`` function it is given. A method that keeps something across iterations keeps it in its
parts' ``state_dict`` (checkpointed with the run); extras live for one iteration.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import attrs
import torch
from torch import Tensor

Gather = Callable[[Tensor], Tensor]  # one tensor from every process, concatenated along dim 0 in process order


class Extra(ABC):
    """Rollout data with its rule for joining several processes' pieces."""

    @abstractmethod
    def gathered(self, gather: Gather, processes: int) -> Extra:
        """The global value: this process's piece joined with every other process's, in process order.

        ``gather`` must be called the same number of times, with tensors of the same shape, on every process
        (it is a collective); ``processes`` is how many there are. Called only with more than one process.
        """


@attrs.frozen
class PerRollout(Extra):
    """A tensor with one row per rollout (dim 0); the global value is every process's rows in order."""

    value: Tensor

    def gathered(self, gather: Gather, processes: int) -> PerRollout:
        return PerRollout(gather(self.value))


@attrs.frozen
class RolloutIds(Extra):
    """One integer id per rollout, meaningful within its process; globally, process ``k``'s ids are shifted
    by ``k`` times (the largest id on any process + 1), so ids from different processes never collide."""

    value: Tensor  # (R,) long

    def gathered(self, gather: Gather, processes: int) -> RolloutIds:
        return RolloutIds(unique_ids(gather, self.value, processes))


def unique_ids(gather: Gather, ids: Tensor, processes: int, per_process: int | None = None) -> Tensor:
    """Every process's ``ids`` (same length on each) with process ``k``'s shifted by ``k * width``.

    ``width`` is ``per_process`` when given (ids known to lie in ``[0, per_process)``, e.g. node ids of a
    fixed node count), else the largest id on any process + 1. Negative ids (``-1``: none) stay as they are.
    """
    width = per_process
    if width is None:
        width = int(gather(ids.max().reshape(1)).max()) + 1 if ids.numel() else 0
    offset = torch.arange(processes).repeat_interleave(ids.shape[0]) * width
    every = gather(ids)
    return torch.where(every >= 0, every + offset, every)
