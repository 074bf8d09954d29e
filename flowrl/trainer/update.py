"""The update phase of an iteration: inner epochs over the rollout, each one the micro-batches' losses
(:mod:`flowrl.trainer.micro_batches`), backward, gradient clipping, the non-finite guard and the optimizer step
(with the lagged copy's blend after it)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

import torch

from flowrl.config.recipe import Recipe
from flowrl.core.interfaces import ForwardProcessLoss, PolicyLoss
from flowrl.core.rng import generator
from flowrl.core.types import Advantages, RewardBatch, Rollout, Schedule
from flowrl.trainer.micro_batches import StatsMean, forward_process_losses, transition_losses
from flowrl.trainer.policy import TrainedPolicy
from flowrl.trainer.retain import RetainedVelocities
from flowrl.trainer.run_errors import NonFiniteError


class PolicyUpdate:
    """One policy update per iteration (``trainer.inner_epochs`` optimizer steps); counts the steps taken and
    the iterations skipped because a reward, advantage, loss or gradient norm was NaN or inf.

    Given the graphs the rollout kept (``trainer.update`` resolved to ``retain``, :mod:`flowrl.trainer.retain`),
    it backpropagates through them once, with no forward of its own.
    """

    def __init__(
        self,
        recipe: Recipe,
        policy: TrainedPolicy,
        loss_fn: Any,
        schedule: Schedule,
    ) -> None:
        self.recipe, self.cfg, self.policy, self.loss_fn = recipe, recipe.trainer, policy, loss_fn
        self.schedule, self.accelerator = schedule, policy.accelerator
        self.bad_steps = 0  # non-finite iterations in a row
        self.skipped = 0  # non-finite iterations in all (kept in checkpoints)
        self.updates = 0  # optimizer steps taken since this process started the run (or resumed it)
        self.old_means: dict[int, torch.Tensor] = {}
        self.rows = 0  # transformer rows of the last update: each forward row twice (with its backward), each
        # retained row once (its forward was the rollout's)

    def restore(self, skipped: int) -> None:
        """A resumed run's count of skipped iterations (its checkpoint's); ``updates`` counts this process's own."""
        self.skipped = skipped

    def __call__(self, rollout: Rollout, advantages: Advantages, rewards: RewardBatch, step: int,
                 retained: RetainedVelocities | None = None) -> dict[str, float]:
        """Inner epochs over the rollout's transitions; one optimizer step each. Non-finite steps are skipped.
        ``retained``: the rollout's kept graphs (:class:`flowrl.trainer.retain.Retention`), else recompute."""
        try:
            return self._update(rollout, advantages, rewards, step, retained)
        finally:
            self.old_means = {}  # the kept means go with it (the kept graphs with the caller's reference)

    def _update(self, rollout: Rollout, advantages: Advantages, rewards: RewardBatch, step: int,
                retained: RetainedVelocities | None) -> dict[str, float]:
        result: dict[str, float] = {"loss": 0.0, "clip_frac": 0.0, "grad_norm": 0.0}
        self.rows = 0
        if isinstance(self.loss_fn, PolicyLoss) and len(rollout.transitions) == 0:
            return result
        self.policy.module.train()
        backbone, backward_s = self.policy.backbone, 0.0
        self.old_means = {}  # the first epoch's transition means (losses that need the old mean), kept for the rest
        for _ in range(self.cfg.inner_epochs):
            self.policy.zero_grad()
            stats = StatsMean()
            total_loss, pending = torch.zeros(()), None
            nfe0 = backbone.nfe
            for loss, share, batch_stats in self.micro_batches(rollout, advantages, step, retained):
                if retained is not None:  # kept graphs may serve several micro-batches: one backward
                    pending = loss * share if pending is None else pending + loss * share
                else:
                    start = time.perf_counter()
                    self.accelerator.backward(loss * share)
                    backward_s += time.perf_counter() - start
                total_loss = total_loss + loss.detach().cpu() * share
                stats.add(batch_stats, share)
            self.rows += 2 * (backbone.nfe - nfe0)
            if pending is not None and retained is not None:
                start = time.perf_counter()
                self.accelerator.backward(pending)
                self.average_gradients()
                backward_s += time.perf_counter() - start
                figures = retained.release()
                self.rows += figures["update/backward_rows"]
                result.update(figures)
            grad_norm = self.policy.clip_grad_norm(self.recipe.optim.max_grad_norm)
            finite = all(
                math.isfinite(float(x)) for x in (total_loss, grad_norm, rewards.total.sum(), advantages.values.sum())
            )
            if not finite:
                self._bad_step()
                self.policy.zero_grad()
                result = {"loss": float("nan"), "clip_frac": float("nan"), "grad_norm": float(grad_norm)}
                break
            self.bad_steps = 0
            self.policy.step()
            self.updates += 1
            if (lagged := self.policy.lagged) is not None:
                decay = self._lagged_decay()
                lagged.blend(decay)
                result.update({"lagged/decay": decay, "lagged/distance": lagged.distance()})
            result.update({"loss": float(total_loss), "grad_norm": float(grad_norm), **stats.result()})
            result.setdefault("clip_frac", 0.0)
            result["time/backward_s"] = backward_s
        return result

    def micro_batches(
        self, rollout: Rollout, advantages: Advantages, step: int, retained: RetainedVelocities | None = None
    ) -> Iterator[tuple[torch.Tensor, float, dict]]:
        """(loss, share, stats) per micro-batch: recorded transitions, or re-noised rollouts (forward process)."""
        backbone, batch, reference = self.policy.backbone, self.cfg.train_batch_size, self.policy.reference
        if isinstance(self.loss_fn, ForwardProcessLoss):
            nft = generator(self.recipe.seed, step, "forward_process", self.accelerator.process_index)
            values = advantages.values
            lagged = self.policy.lagged.weights if self.policy.lagged is not None else None
            return forward_process_losses(backbone, self.loss_fn, rollout, values, batch, nft, reference, lagged)
        kernel, cond, transitions = self.schedule.kernel, rollout.cond, rollout.transitions
        return transition_losses(
            backbone, kernel, self.loss_fn, self.schedule, cond, transitions, advantages.values, batch, reference,
            node_advantages=advantages.nodes, velocity=retained.velocity if retained is not None else None,
            old_means=self.old_means,
        )

    def _lagged_decay(self) -> float:
        assert isinstance(self.loss_fn, ForwardProcessLoss)
        decay = self.loss_fn.lagged_decay(self.policy.lr_schedule.last_epoch)
        if decay is None:
            raise ValueError(f"{type(self.loss_fn).__name__}.lagged_decay gave None after a number at step 0")
        return float(decay)

    def average_gradients(self) -> None:
        """Average the gradients over the processes: the retained forwards ran outside DDP, which would do it."""
        world = self.accelerator.num_processes
        if world == 1:
            return
        params = [p for _, p in self.policy.named_params]
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in params])
        torch.distributed.all_reduce(flat)
        flat /= world
        offset = 0
        for p in params:
            p.grad = flat[offset : offset + p.numel()].view_as(p).clone()
            offset += p.numel()

    def _bad_step(self) -> None:
        self.bad_steps += 1
        self.skipped += 1
        if self.bad_steps >= self.cfg.max_bad_steps:
            raise NonFiniteError(
                f"{self.bad_steps} iterations in a row had NaN or inf in rewards, advantages, loss or gradient norm;"
                f" stopping (trainer.max_bad_steps = {self.cfg.max_bad_steps})"
            )

