"""The optimisation phase of an iteration: inner epochs over the rollout, micro-batch losses, backward,
gradient clipping, the non-finite guard and the optimizer step."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

import torch

from flowrl.interfaces import ForwardProcessLoss, PolicyLoss
from flowrl.recipe import Recipe
from flowrl.rng import generator
from flowrl.trainer.errors import NonFiniteError
from flowrl.trainer.policy import TrainedPolicy
from flowrl.trainer.update import StatsMean, forward_process_losses, transition_losses
from flowrl.types import Advantages, RewardBatch, Rollout, Schedule


class PolicyUpdate:
    """One policy update per iteration (``trainer.inner_epochs`` optimizer steps); counts the steps taken and
    the iterations skipped because a reward, advantage, loss or gradient norm was NaN or inf."""

    def __init__(
        self,
        recipe: Recipe,
        policy: TrainedPolicy,
        loss_fn: Any,
        schedule: Schedule,
    ) -> None:
        self.recipe, self.cfg, self.policy, self.loss_fn = recipe, recipe.trainer, policy, loss_fn
        self.schedule, self.accelerator, self.reference = schedule, policy.accelerator, policy.reference
        self.bad_steps = 0  # non-finite iterations in a row
        self.skipped = 0  # non-finite iterations in all (kept in checkpoints)
        self.updates = 0  # optimizer steps taken since this process started the run (or resumed it)

    def __call__(self, rollout: Rollout, advantages: Advantages, rewards: RewardBatch, step: int) -> dict[str, float]:
        """Inner epochs over the rollout's transitions; one optimizer step each. Non-finite steps are skipped."""
        result: dict[str, float] = {"loss": 0.0, "clip_frac": 0.0, "grad_norm": 0.0}
        if isinstance(self.loss_fn, PolicyLoss) and len(rollout.transitions) == 0:
            return result
        self.policy.module.train()
        backward_s = 0.0
        for _ in range(self.cfg.inner_epochs):
            self.policy.zero_grad()
            stats = StatsMean()
            total_loss = torch.zeros(())
            for loss, share, batch_stats in self.micro_batches(rollout, advantages, step):
                start = time.perf_counter()
                self.accelerator.backward(loss * share)
                backward_s += time.perf_counter() - start
                total_loss = total_loss + loss.detach().cpu() * share
                stats.add(batch_stats, share)
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
            result = {"loss": float(total_loss), "grad_norm": float(grad_norm), **stats.result()}
            result.setdefault("clip_frac", 0.0)
            result["time/backward_s"] = backward_s
        return result

    def micro_batches(
        self, rollout: Rollout, advantages: Advantages, step: int
    ) -> Iterator[tuple[torch.Tensor, float, dict]]:
        """(loss, share, stats) per micro-batch: recorded transitions, or re-noised rollouts (forward process)."""
        backbone, batch = self.policy.backbone, self.cfg.train_batch_size
        if isinstance(self.loss_fn, ForwardProcessLoss):
            nft = generator(self.recipe.seed, step, "forward_process", self.accelerator.process_index)
            values = advantages.values
            return forward_process_losses(backbone, self.loss_fn, rollout, values, batch, nft, self.reference)
        kernel, cond, transitions = self.schedule.kernel, rollout.cond, rollout.transitions
        return transition_losses(
            backbone, kernel, self.loss_fn, self.schedule, cond, transitions, advantages.values, batch, self.reference,
            node_advantages=advantages.nodes,
        )

    def _bad_step(self) -> None:
        self.bad_steps += 1
        self.skipped += 1
        if self.bad_steps >= self.cfg.max_bad_steps:
            raise NonFiniteError(
                f"{self.bad_steps} iterations in a row had NaN or inf in rewards, advantages, loss or gradient norm;"
                f" stopping (trainer.max_bad_steps = {self.cfg.max_bad_steps})"
            )
