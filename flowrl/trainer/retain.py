"""The recompute-free update (``trainer.update = "retain"``, :mod:`flowrl.config.update_modes`): the rollout's
forwards at trained inputs keep their autograd graphs, and the update finds each trained input's velocity
among them instead of running the transformer again.

No sampler takes part: while the rollout runs, :meth:`RetainedVelocities.recording` stands in for the
backbone's ``velocity``. A call at a trained unit's noise level (outside the reference policy and outside
:func:`flowrl.parts.samplers.untrained.untrained_forwards`) runs with gradients on a detached input and is kept; the
sampler gets the velocity detached, so nothing it computes carries a graph. At update time a trained input
is matched to a kept row by its exact contents (latent, noise level and conditioning, compared bit for bit);
an input that matches nothing is computed again, so a sampler the mechanism does not know costs time, never
correctness.

Memory: the kept graphs live from their forward to the update's backward. Their size is counted while they are
made (the tensors autograd saves, parameters left out). ``trainer.memory_budget`` bounds them: a call is kept
whole while the whole graphs fit under the budget less what the process held as the rollout started and a
reserve for the update (gradients, the optimizer's state before its first step, one call's transient); past
that, the call runs with its blocks checkpointed (:mod:`flowrl.trainer.checkpoint_switch`: only each block's
input is kept, and the backward runs the block's forward again), which is still exact and still saves the
update's own forward. Without a budget the bound is 90% of the memory free as the rollout started. When even
the checkpointed graphs would pass the budget (or that 90%), an explicit ``retain`` stops with a recipe error
before the device runs out; under ``auto`` the kept graphs are dropped (:attr:`RetainedVelocities.abandoned`)
and the update recomputes, as ``recompute`` would.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from flowrl.config.recipe import Recipe, RecipeError
from flowrl.config.update_modes import resolve_update
from flowrl.core.interfaces import Backbone
from flowrl.core.types import Conditioning, Plan, Schedule
from flowrl.parts.samplers.untrained import forwards_untrained
from flowrl.trainer.checkpoint_switch import CheckpointSwitch
from flowrl.trainer.memory import available_bytes, peak_bytes, total_bytes, used_bytes
from flowrl.utils.sizes import parse_size, show_size


def fingerprints(t: Tensor) -> Tensor:
    """One int64 per row from the exact bits of ``t``'s float32 values (equal rows, equal fingerprints,
    whatever the batch they came in): the bits weighted by fixed pseudo-random odd integers, summed."""
    bits = t.detach().float().reshape(t.shape[0], -1).contiguous().view(torch.int32).long()
    gen = torch.Generator().manual_seed(bits.shape[1])
    weights = (torch.randint(0, 2**30, (bits.shape[1],), generator=gen) * 2 + 1).to(bits.device)
    return (bits * weights).sum(1)


def row_keys(x: Tensor, s: Tensor, cond: Conditioning) -> list[tuple[int, ...]]:
    """The lookup key of every row: fingerprints of the latent, the noise level and each conditioning tensor."""
    parts = [fingerprints(x), fingerprints(s.reshape(-1, 1))]
    parts += [fingerprints(cond.tensors[name]) for name in sorted(cond.tensors)]
    return [tuple(row) for row in torch.stack(parts, 1).cpu().tolist()]


class RetainedVelocities:
    """Velocities with their graphs from one rollout, by exact input.

    ``levels`` are the noise levels of the plan's trained units' starts (calls elsewhere are not kept).
    ``module``, when given, is what the kept forwards call instead of the backbone's module (a multi-process
    run's unwrapped transformer: the trainer then averages the gradients itself). ``limit`` bounds every kept
    byte (None: no bound; past it the graphs are dropped, or a recipe error under ``strict``) and
    ``whole_limit`` the whole graphs (past it, with a ``switch``, calls are checkpointed); ``per_row`` is a whole
    graph's size per row measured before (0: unknown, the next call is kept whole and measured).
    """

    def __init__(
        self, backbone: Backbone, levels: Tensor, module: nn.Module | None = None, source: str = "",
        strict: bool = True, limit: int | None = None, whole_limit: int | None = None,
        switch: CheckpointSwitch | None = None, per_row: float = 0.0, budget_key: str = "trainer.update",
    ) -> None:
        self.backbone, self.module, self.source, self.strict = backbone, module, source, strict
        self.switch = switch if switch is not None and switch.available else None
        self.whole_limit, self.per_row, self.budget_key = whole_limit, per_row, budget_key
        self.rows_checkpointed = 0  # rows whose graph keeps only its blocks' inputs
        self.bytes_whole = 0  # bytes of the graphs kept whole
        self.largest_call = 0  # the most rows one kept call had
        self.levels = levels.detach().float().cpu()  # compared with every call's noise levels
        self.abandoned = ""  # why the kept graphs were dropped (auto mode, too large); "" while kept
        self.kept: list[tuple[Tensor, Tensor]] = []  # (detached input, velocity with graph) per kept call
        self.index: dict[tuple[int, ...], tuple[int, int]] = {}  # row key -> (call, row)
        self.rows_kept = 0
        self.rows_used: set[tuple[int, int]] = set()
        self.misses = 0
        self.bytes_kept = 0
        self._reference_depth = 0
        self._own: set[int] = set()  # storages of the parameters and buffers (not counted as kept)
        self._limit = limit

    @staticmethod
    def trained_levels(plan: Plan, schedule: Schedule) -> Tensor:
        """The noise levels at which the plan's trained units start."""
        sigmas = schedule.tensor()
        return sigmas[torch.tensor(sorted({plan.units[k].start for k in plan.trained}), dtype=torch.long)]

    @contextmanager
    def recording(self) -> Iterator[None]:
        """Inside, the backbone's velocity keeps the graphs of calls at trained levels (see the module doc)."""
        backbone = self.backbone
        velocity, reference_policy = backbone.velocity, backbone.reference_policy

        def kept_velocity(x: Tensor, s: Tensor, cond: Conditioning) -> Tensor:
            at_level = torch.isin(s.detach().float().cpu(), self.levels)
            if self.abandoned or self._reference_depth or forwards_untrained() or not bool(at_level.any()):
                return velocity(x, s, cond)
            x = x.detach()
            swap: AbstractContextManager[None] = (
                backbone.module_swapped(self.module) if self.module is not None else nullcontext()
            )
            counted: set[int] = set()

            def pack(t: Tensor) -> Tensor:
                storage = t.untyped_storage()
                ptr = storage.data_ptr()
                if ptr not in self._own and ptr not in counted:
                    counted.add(ptr)
                    self.bytes_kept += storage.nbytes()
                return t

            rows, before = int(x.shape[0]), self.bytes_kept
            whole = self._whole_fits(rows)
            blocks = nullcontext() if whole or self.switch is None else self.switch.on(pack)
            with torch.enable_grad(), swap, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), blocks:
                v = velocity(x, s, cond)
            self.rows_kept += rows
            self.largest_call = max(self.largest_call, rows)
            if whole:
                self.bytes_whole += self.bytes_kept - before
                self.per_row = max(self.per_row, (self.bytes_kept - before) / rows)
            else:
                self.rows_checkpointed += rows
            self._check_fits()
            if self.abandoned:
                return v.detach()
            call = len(self.kept)
            self.kept.append((x, v))
            for row, key in enumerate(row_keys(x, s, cond)):
                self.index.setdefault(key, (call, row))
            return v.detach()

        @contextmanager
        def counted_reference() -> Iterator[None]:
            self._reference_depth += 1
            try:
                with reference_policy():
                    yield
            finally:
                self._reference_depth -= 1

        tensors = [*backbone.transformer.parameters(), *backbone.transformer.buffers()]
        self._own = {t.untyped_storage().data_ptr() for t in tensors}
        backbone.velocity = kept_velocity  # type: ignore[method-assign]
        backbone.reference_policy = counted_reference  # type: ignore[method-assign]
        try:
            yield
        finally:
            del backbone.velocity, backbone.reference_policy  # the class's methods again

    def _whole_fits(self, rows: int) -> bool:
        """Whether a call of ``rows`` rows may keep its whole graph (always, when nothing can be checkpointed)."""
        if self.switch is None or self.whole_limit is None:
            return True
        return self.bytes_whole + self.per_row * rows <= self.whole_limit

    def _check_fits(self) -> None:
        if self._limit is None or self.bytes_kept <= self._limit:
            return
        bound = show_size(self._limit)
        room = (f"trainer.memory_budget less what the process held when it started ({bound})"
                if self.budget_key != "trainer.update"
                else f"90% of the memory free on {self.backbone.device.type} when it started ({bound})")
        checkpointed = f", {self.rows_checkpointed} of them checkpointed" if self.rows_checkpointed else ""
        why = (f"the rollout's retained graphs passed {show_size(self.bytes_kept)}, over {room}"
               f" ({self.rows_kept} rows kept{checkpointed})")
        self.kept, self.index = [], {}
        if self.strict:
            advice = ": set 'recompute' or 'auto', a larger budget, or fewer prompts or rollouts per step"
            raise RecipeError(self.source or "<recipe>", [(self.budget_key, why + advice)])
        self.abandoned = why + "; the update recomputes from now on"

    def velocity(self, x: Tensor, s: Tensor, cond: Conditioning) -> Tensor:
        """The kept velocities of these inputs (graphs attached), or the backbone's velocity, computed again
        with gradients, when a row matches no kept call."""
        found = [self.index.get(key) for key in row_keys(x, s, cond)]
        if any(f is None for f in found) or not all(
            torch.equal(self.kept[c][0][r], x[i].to(self.kept[c][0].dtype)) for i, (c, r) in enumerate(found)  # type: ignore[misc]
        ):
            self.misses += int(x.shape[0])
            return self.backbone.velocity(x, s, cond)
        self.rows_used.update(found)  # type: ignore[arg-type]
        return torch.stack([self.kept[c][1][r] for c, r in found])  # type: ignore[misc]

    def release(self) -> dict[str, Any]:
        """Drop every kept graph; figures of this iteration for the log: rows kept, distinct rows the update
        used (equal inputs share one), rows computed again, and rows the backward ran through (every row of a
        kept call that served the update: the graph is batched)."""
        calls = {c for c, _ in self.rows_used}
        figures = {"update/retained_rows": self.rows_kept, "update/retained_used": len(self.rows_used),
                   "update/retained_mb": self.bytes_kept / 2**20,
                   "update/checkpointed_rows": self.rows_checkpointed,
                   "update/recomputed_rows": self.misses,
                   "update/backward_rows": sum(int(self.kept[c][0].shape[0]) for c in calls)}
        self.kept, self.index = [], {}
        return figures


class Retention:
    """What ``trainer.update`` resolved to for this run (``retain`` or ``recompute``), and the graphs the last
    rollout kept: the rollout phase opens :meth:`recording`, the update takes them with :meth:`take`."""

    def __init__(self, recipe: Recipe, backbone: Backbone, several: bool) -> None:
        self.recipe, self.backbone, self.several = recipe, backbone, several
        self.mode = resolve_update(recipe)
        if self.mode == "retain" and active_dropout(backbone.module):  # e.g. the backbone's own dropout
            self.mode = "recompute"
            if recipe.trainer.update == "retain":
                why = "'retain' is not exact: the transformer has active dropout; use 'recompute' or 'auto'"
                raise RecipeError(recipe.source, [("trainer.update", why)])
        self.kept: RetainedVelocities | None = None
        self.switch = CheckpointSwitch(backbone.transformer)
        self.per_row = 0.0  # a whole graph's bytes per row, as the last rollout measured them
        self.largest_call = 0  # the most rows one kept call had
        self.recordings = 0  # rollouts recorded (before the first update the optimizer holds no state yet)
        self.base_used: int | None = None  # off CUDA: the resident set as the first rollout started
        self.beside = 0  # under a budget: what an iteration needed beside its kept graphs, at most, as measured
        self.last_start = 0  # what the process held as the last rollout started
        self.last: tuple[int, int] | None = None  # (that, the bytes the last rollout kept), once its update ran
        self.last_checkpointed = 0  # the bytes the last rollout kept of checkpointed calls

    def limits(self) -> tuple[int | None, int | None]:
        """Bounds for this rollout's kept graphs, all of them and the whole ones (None: unbounded).

        Without ``trainer.memory_budget``: 90% of the memory free now, and for whole graphs that less a reserve
        for the update (the trainable parameters' gradients, the optimizer's two moments before its first step,
        and the largest call's graph). With one: the budget less what the process holds now and less the
        memory an iteration needs beside its kept graphs (latents, images, the backward's own buffers), which
        the previous iteration measured as its peak less what it held at its start and its kept graphs; no
        iteration has measured that before the first rollout, so the first keeps only its first call whole
        and checkpoints the others. Off CUDA "what the process holds" is the resident set as the first
        rollout started: the C allocator keeps the pages of freed graphs for the next ones."""
        device = self.backbone.device
        free = available_bytes(device)
        hard = None if free is None else int(0.9 * free)
        budget, used = self.budget_bytes(), used_bytes(device)
        if device.type != "cuda":  # what CUDA frees is free again; a CPU process's resident set keeps its peak
            self.base_used = used if self.base_used is None else self.base_used
            used = self.base_used
        if budget is None or used is None:
            if hard is None:
                return None, None
            trainable = sum(p.numel() * p.element_size() for p in self.backbone.transformer.parameters()
                            if p.requires_grad)
            reserve = trainable * (3 if self.recordings == 0 else 1) + int(self.per_row * self.largest_call)
            return hard, hard - reserve
        peak = peak_bytes(device)
        if self.last is not None and peak is not None:  # (what the last iteration held at its start, kept)
            self.beside = max(self.beside, peak - self.last[0] - self.last[1])
        self.last_start = used
        # off CUDA the resident set also holds what the C allocator has not handed back (fragments between freed
        # graphs): measured on the embedded world, a twentieth of the budget covers it
        room = budget - used - self.beside - (0 if device.type == "cuda" else budget // 20)
        limit = room if hard is None else min(hard, room)
        if self.recordings == 0:
            return limit, 0  # the first call whole (its size measured), the others checkpointed
        return limit, room - self.last_checkpointed

    def budget_bytes(self) -> int | None:
        """``trainer.memory_budget`` in bytes (a share of the device's memory resolved); None when not set."""
        text = self.recipe.trainer.memory_budget
        if text == "":
            return None
        size, share = parse_size(str(text))
        if size is not None:
            return size
        total = total_bytes(self.backbone.device)
        return None if total is None or share is None else int(share * total)

    def recording(self, plan: Plan, schedule: Schedule) -> AbstractContextManager[None]:
        """The context of the rollout: with ``retain``, the trained inputs' forwards keep their graphs."""
        self.kept = None
        if self.mode != "retain" or not plan.trained:
            return nullcontext()
        levels = RetainedVelocities.trained_levels(plan, schedule)
        module = self.backbone.transformer if self.several else None  # the kept forwards skip DDP
        strict = self.recipe.trainer.update == "retain"  # auto: graphs too large for memory fall back to recomputing
        limit, whole_limit = self.limits()
        key = "trainer.memory_budget" if self.recipe.trainer.memory_budget != "" else "trainer.update"
        self.kept = RetainedVelocities(self.backbone, levels, module, self.recipe.source, strict, limit, whole_limit,
                                       self.switch, self.per_row, key)
        self.recordings += 1
        return self.kept.recording()

    def take(self) -> RetainedVelocities | None:
        """The last rollout's kept graphs, handed over once (None: the update recomputes). Under ``auto``, graphs
        that outgrew the memory are dropped and every later update recomputes; that is said once, here."""
        kept, self.kept = self.kept, None
        if kept is not None:
            self.per_row = max(self.per_row, kept.per_row)
            self.largest_call = max(self.largest_call, kept.largest_call)
            self.last = (self.last_start, kept.bytes_kept)
            self.last_checkpointed = kept.bytes_kept - kept.bytes_whole
        if kept is not None and kept.abandoned:
            tqdm.write(f"trainer.update = auto: {kept.abandoned}", file=sys.stderr)
            self.mode = "recompute"
            return None
        return kept


def active_dropout(module: nn.Module) -> bool:
    """Whether ``module`` holds a dropout layer with a non-zero rate (training mode then changes its output)."""
    return any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in module.modules())
