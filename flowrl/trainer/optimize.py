"""The optimisation phase of an iteration: inner epochs over the rollout, micro-batch losses, backward,
gradient clipping, the non-finite guard and the optimizer step."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from flowrl.interfaces import ForwardProcessLoss, PolicyLoss
from flowrl.recipe import Recipe
from flowrl.rng import generator
from flowrl.trainer.errors import NonFiniteError
from flowrl.trainer.lagged import LaggedPolicy
from flowrl.trainer.policy import TrainedPolicy
from flowrl.trainer.retain import RetainedVelocities
from flowrl.trainer.update import StatsMean, forward_process_losses, transition_losses
from flowrl.types import Advantages, Plan, RewardBatch, Rollout, Schedule
from flowrl.update_modes import resolve_update


class PolicyUpdate:
    """One policy update per iteration (``trainer.inner_epochs`` optimizer steps); counts the steps taken and
    the iterations skipped because a reward, advantage, loss or gradient norm was NaN or inf.

    With ``trainer.update`` resolved to ``retain`` (:mod:`flowrl.update_modes`), :meth:`recording` keeps the
    rollout's graphs at trained inputs and the update backpropagates through them once, with no forward of
    its own (:mod:`flowrl.trainer.retain`).
    """

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
        self.mode = resolve_update(recipe)
        if self.mode == "retain" and active_dropout(policy.module):  # e.g. the backbone's own dropout
            self.mode = "recompute"
            if self.cfg.update == "retain":
                from flowrl.recipe import RecipeError

                why = "'retain' is not exact: the transformer has active dropout; use 'recompute' or 'auto'"
                raise RecipeError(recipe.source, [("trainer.update", why)])
        self.lagged = self._lagged_policy()  # a lagged copy of the weights, for losses that ask for one
        self.retained: RetainedVelocities | None = None
        self.old_means: dict[int, torch.Tensor] = {}
        self.rows = 0  # transformer rows of the last update: each forward row twice (with its backward), each
        # retained row once (its forward was the rollout's)

    def sampling(self) -> AbstractContextManager[None]:
        """The context of the rollout's sampling: the lagged copy's weights where the loss samples with them
        (``ForwardProcessLoss.samples_from_lagged``; a no-gradient phase), else the trained weights."""
        if self.lagged is None or not isinstance(self.loss_fn, ForwardProcessLoss):
            return nullcontext()
        return self.lagged.weights() if self.loss_fn.samples_from_lagged() else nullcontext()

    def recording(self, plan: Plan) -> AbstractContextManager[None]:
        """The context of the rollout: with ``retain``, the trained inputs' forwards keep their graphs."""
        self.retained = None
        if self.mode != "retain" or not plan.trained:
            return nullcontext()
        backbone = self.policy.backbone
        several = self.accelerator.num_processes > 1  # the kept forwards skip DDP; gradients averaged below
        levels = RetainedVelocities.trained_levels(plan, self.schedule)
        module = backbone.transformer if several else None
        strict = self.cfg.update == "retain"  # auto: graphs too large for memory fall back to recomputing
        self.retained = RetainedVelocities(backbone, levels, module, self.recipe.source, strict)
        return self.retained.recording()

    def __call__(self, rollout: Rollout, advantages: Advantages, rewards: RewardBatch, step: int) -> dict[str, float]:
        """Inner epochs over the rollout's transitions; one optimizer step each. Non-finite steps are skipped."""
        if self.retained is not None and self.retained.abandoned:
            tqdm.write(f"trainer.update = auto: {self.retained.abandoned}", file=sys.stderr)
            self.mode, self.retained = "recompute", None
        try:
            return self._update(rollout, advantages, rewards, step)
        finally:
            self.retained, self.old_means = None, {}  # the kept graphs and means go with it

    def _update(self, rollout: Rollout, advantages: Advantages, rewards: RewardBatch, step: int) -> dict[str, float]:
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
            for loss, share, batch_stats in self.micro_batches(rollout, advantages, step):
                if self.retained is not None:  # kept graphs may serve several micro-batches: one backward
                    pending = loss * share if pending is None else pending + loss * share
                else:
                    start = time.perf_counter()
                    self.accelerator.backward(loss * share)
                    backward_s += time.perf_counter() - start
                total_loss = total_loss + loss.detach().cpu() * share
                stats.add(batch_stats, share)
            self.rows += 2 * (backbone.nfe - nfe0)
            if pending is not None and self.retained is not None:
                start = time.perf_counter()
                self.accelerator.backward(pending)
                self.average_gradients()
                backward_s += time.perf_counter() - start
                figures = self.retained.release()
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
            if self.lagged is not None:
                decay = self._lagged_decay()
                self.lagged.blend(decay)
                result.update({"lagged/decay": decay, "lagged/distance": self.lagged.distance()})
            result.update({"loss": float(total_loss), "grad_norm": float(grad_norm), **stats.result()})
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
            lagged = self.lagged.weights if self.lagged is not None else None
            return forward_process_losses(backbone, self.loss_fn, rollout, values, batch, nft, self.reference, lagged)
        kernel, cond, transitions = self.schedule.kernel, rollout.cond, rollout.transitions
        return transition_losses(
            backbone, kernel, self.loss_fn, self.schedule, cond, transitions, advantages.values, batch, self.reference,
            node_advantages=advantages.nodes, velocity=self.retained.velocity if self.retained is not None else None,
            old_means=self.old_means,
        )

    def _lagged_policy(self) -> LaggedPolicy | None:
        """The lagged copy when the loss asks for one (``ForwardProcessLoss.lagged_decay``), kept in the
        policy's checkpointed state; not with sharded weights, which the copy's swap does not handle."""
        if not isinstance(self.loss_fn, ForwardProcessLoss) or self.loss_fn.lagged_decay(0) is None:
            return None
        if self.policy.sharded:  # load_recipe refuses the combination (recipe.cross_checks)
            raise ValueError("a lagged copy of the weights needs unsharded weights")
        self.policy.lagged = LaggedPolicy(self.policy.named_params)
        return self.policy.lagged

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


def active_dropout(module: nn.Module) -> bool:
    """Whether ``module`` holds a dropout layer with a non-zero rate (training mode then changes its output)."""
    return any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in module.modules())
