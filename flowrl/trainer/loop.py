"""The shared training loop. One iteration, in phases, each with one owner:

    prompts -> plan -> rollout       flowrl.trainer.rollout (RolloutPhase)
    rewards                          flowrl.trainer.rewards (score_rollout)
    advantages                       flowrl.trainer.advantage (global_advantages)
    policy update                    flowrl.trainer.update (PolicyUpdate)
    log / evaluate / checkpoint      flowrl.trainer.logger, .heldout, .checkpoints

Every method is this loop with different parts; no method has a trainer of its own.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from flowrl.config.recipe import Recipe
from flowrl.core.rng import generator
from flowrl.core.types import Advantages, RewardBatch, Rollout
from flowrl.trainer.advantage import global_advantages
from flowrl.trainer.budget import Budget
from flowrl.trainer.checkpoints.folder import find_checkpoint
from flowrl.trainer.checkpoints.restart import RestartPoint
from flowrl.trainer.checkpoints.resume import check_resume
from flowrl.trainer.checkpoints.saving import RunCheckpoints, best_figure
from flowrl.trainer.distributed import reduce_metrics, shared_stop
from flowrl.trainer.drift import policy_drift
from flowrl.trainer.health import HealthAlerts
from flowrl.trainer.heldout import HeldOut
from flowrl.trainer.lagged import wants_lagged
from flowrl.trainer.logger import RunLogger
from flowrl.trainer.memory import RolloutFits
from flowrl.trainer.metrics import iteration_metrics
from flowrl.trainer.parts import RunParts, build_parts
from flowrl.trainer.policy import TrainedPolicy
from flowrl.trainer.process import start_process
from flowrl.trainer.reference import no_reference
from flowrl.trainer.retain import Retention
from flowrl.trainer.rollout import RolloutPhase
from flowrl.trainer.run_errors import NothingTrainedError, RunInterrupted
from flowrl.trainer.runfolder import RunFolder
from flowrl.trainer.stop import StopSignal
from flowrl.trainer.update import PolicyUpdate


def _part(name: str) -> Any:
    """A read-only attribute of the trainer that is one of its :class:`RunParts`."""
    return property(lambda self: getattr(self.parts, name), doc=f"The run's {name} (:class:`RunParts`).")


class Trainer:
    """Builds every part of a recipe and runs the loop; ``run()`` trains to ``trainer.max_steps``. ``run_dir`` is a
    :class:`~flowrl.trainer.runfolder.RunFolder` (the command line's, checked) or a path."""

    prompts, selector, sampler, estimator, backbone = map(_part, ("prompts", "selector", "sampler", "estimator",
                                                                  "backbone"))
    loss_fn, schedule, eval_schedule = _part("loss"), _part("schedule"), _part("eval_schedule")

    def __init__(self, recipe: Recipe, run_dir: RunFolder | Path, resume: Path | None = None,
                 quiet: bool = False) -> None:
        checkpoint = find_checkpoint(resume, exported=False) if resume is not None else None
        changes = check_resume(checkpoint, recipe) if checkpoint is not None else []  # before anything loads
        self.folder = run_dir if isinstance(run_dir, RunFolder) else RunFolder(run_dir)
        self.recipe, self.cfg, self.run_dir, self.quiet = recipe, recipe.trainer, self.folder.path, quiet
        # 1. the process, then the parts: rewards and trackers first, so missing weights fail before the base loads
        self.accelerator = start_process(recipe)
        self.parts: RunParts = build_parts(recipe, self.accelerator.device)
        self.rewards = self.parts.rewards.rewards
        fits = RolloutFits.of(recipe, self.parts, self.accelerator.device)  # the smallest plan checked now
        # 2. the trained policy (with its frozen reference where a probe or the loss reads one)
        self.policy = TrainedPolicy(self.backbone, recipe, self.accelerator, self.parts.needs_reference,
                                    wants_lagged(self.loss_fn))
        self.named_params = self.policy.named_params
        # 3. the phases, each building what only it uses
        self.retention = Retention(recipe, self.backbone, self.accelerator.num_processes > 1)  # what rollouts keep
        self.rollouts = RolloutPhase(recipe, self.parts, self.policy, self.retention, fits)
        self.updater = PolicyUpdate(recipe, self.policy, self.loss_fn, self.schedule)
        self.heldout = HeldOut(self.prompts, self.rewards, self.eval_schedule, self.cfg, self.policy)
        # 4. checkpoints of every stateful part, the loop's counters and its guards
        self.checkpoints = RunCheckpoints(self.folder, recipe, self.policy, self.parts.stateful(), self.heldout.grid)
        self.restart = RestartPoint(self.parts.stateful(), self.checkpoints.save, self.accelerator.num_processes)
        self.step, self.nfe, self.rows, self.wall = 0, 0, 0, 0.0  # rows: rollouts' and the update's (concepts.md)
        self.best_value = -math.inf  # the best value of trainer.keep_best's figure so far (step 0 included)
        self.budget = Budget(self.cfg, self.accelerator)
        self.alerts = HealthAlerts(self.cfg.alert_diversity, self.cfg.alert_eval_falls)
        # 5. the run folder: locked, checked, then written (nothing is rewritten until every check has passed)
        self.folder.open(self.accelerator.is_main_process, resuming=checkpoint is not None)
        try:
            if checkpoint is not None:
                self._resume(checkpoint)
            self.logger = RunLogger(self.run_dir, self.accelerator.is_main_process, self.step, recipe)
        except BaseException:
            self.release()
            raise
        if self.accelerator.is_main_process:
            resumed = (checkpoint, self.step, changes) if checkpoint is not None else None
            self.folder.write_recipe(recipe.to_toml(), resumed)

    # -- the loop -------------------------------------------------------------------------------
    def run(self) -> Path:
        by_nfe = bool(self.cfg.max_nfe)  # with an NFE budget the bar counts evaluations
        bar = tqdm(
            total=self.cfg.max_nfe if by_nfe else self.cfg.max_steps,
            initial=self.nfe if by_nfe else self.step,
            desc=self.recipe.name,
            unit="nfe" if by_nfe else "it",
            disable=self.quiet or not self.accelerator.is_main_process,
        )
        stop = StopSignal()
        self.budget.start()
        first, stopped = self.step, ""
        try:
            if self.budget.evaluates and self.step == 0:
                figures = self.evaluate()
                self.logger.log({"step": 0, "wall_s": 0.0, "nfe": 0, "rows": 0, **figures})
                self.keep_best(figures)  # the initial weights: checkpoints/best exists once an evaluation ran
            while not self.finished():
                nfe = self.nfe
                with self.restart.guard(self.counters):
                    metrics = self.iteration()
                bar.update(self.nfe - nfe if by_nfe else 1)
                bar.set_postfix(reward=f"{metrics.get('reward/total', float('nan')):.4f}", nfe=self.nfe)
                if self.cfg.checkpoint_every and self.step % self.cfg.checkpoint_every == 0:
                    self.save()
                stopped = shared_stop(self.accelerator, stop.received)  # a signal to any process stops them all
                if stopped:
                    message = f"{stopped}: checkpoint written at step {self.step}; resume with --resume"
                    bar.write(message, file=sys.stderr)
                    break
            self.save()
        finally:
            stop.restore()
            bar.close()
            self.logger.close()
            self.release()
        self.accelerator.wait_for_everyone()
        self.accelerator.end_training()
        stopped = stopped or stop.received  # also a signal during the last iteration's checkpoint
        if stopped:  # the caller (a shell's `train && eval`) must not go on as if the run had finished
            raise RunInterrupted(stopped)
        if self.step > first and self.updates == 0:
            n = self.step - first
            raise NothingTrainedError(
                f"the run trained nothing: {n} iteration{'s' if n != 1 else ''}, {self.skipped} skipped for NaN or"
                " inf, the others without a transition to train (check the rewards and the selector's trained units)"
            )
        return self.run_dir

    def release(self) -> None:
        """Give up the run folder's lock (after the last write; another process may then resume the run)."""
        self.folder.release()

    def finished(self) -> bool:
        """The step limit, the NFE budget or the time limit is reached."""
        return self.budget.finished(self.step, self.nfe)

    def iteration(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        forward0 = self.backbone.forward_s
        # 1. prompts: this process's slice of the global batch
        per, rank = self.cfg.prompts_per_step, self.accelerator.process_index
        prompt_stream = generator(self.recipe.seed, self.step, "prompts")
        everyone = self.prompts.sample(per * self.accelerator.num_processes, prompt_stream)
        prompts = everyone[rank * per : (rank + 1) * per]
        # 2. plan and rollout with the current (old) policy; every transformer evaluation from here to the end
        #    of the rollout counts towards the NFE (a selector's probes included)
        nfe0 = self.backbone.nfe
        plan, rollout = self.rollouts(prompts, self.step, first_row=rank * per)
        nfe_iteration = self.backbone.nfe - nfe0
        t_rollout = time.perf_counter() - t0
        # 3. rewards and advantages
        rewards = self.score(rollout)
        advantages = global_advantages(self.accelerator, self.estimator, rewards, rollout)
        # 4. policy update
        t1 = time.perf_counter()
        update = self.update(rollout, advantages, rewards)
        t_update = time.perf_counter() - t1
        # 5. bookkeeping (evaluation time is not counted in wall_s)
        self.step += 1
        nfe_before = self.nfe
        rows = nfe_iteration + self.updater.rows  # the update's rows: forward and backward (flowrl.trainer.update)
        counted = reduce_metrics(self.accelerator, {"nfe": nfe_iteration, "rows": rows}, summed=("nfe", "rows"))
        self.nfe += counted["nfe"]
        self.rows += counted["rows"]
        t_iter = time.perf_counter() - t0
        self.wall += t_iter
        self.budget.tick()
        t_model = self.backbone.forward_s - forward0 + update.pop("time/backward_s", 0.0)
        seconds = {"rollout": t_rollout, "update": t_update, "iteration": t_iter, "transformer": t_model}
        metrics = iteration_metrics(rollout, rewards, advantages, plan, update, seconds)
        metrics.update({**self.drift(rollout), **self.parts.rewards.weight_figures(rewards), "lr": self.policy.lr})
        metrics = {
            "step": self.step,
            "wall_s": round(self.wall, 4),
            "nfe": self.nfe,
            "rows": self.rows,
            **reduce_metrics(self.accelerator, metrics),
            "skipped_steps": self.skipped,
        }
        figure = None
        if self.budget.evaluation_due(self.step, nfe_before, self.nfe):
            metrics.update(self.evaluate())
            self.keep_best(metrics)
            figure = self.best_figure(metrics, "auto")
        for message in self.alerts.observe(metrics, figure if figure and figure[0] else None):
            if self.accelerator.is_main_process:
                tqdm.write(f"warning at step {self.step}: {message}", file=sys.stderr)
        if self.cfg.log_every and self.step % self.cfg.log_every == 0:
            self.logger.log(metrics)
        if self.cfg.image_every and self.step % self.cfg.image_every == 0:
            self.logger.images("rollouts", rollout.images[:16], self.step, rows=max(1, len(prompts)))
            self.logger.histogram("advantages", advantages.values, self.step)
        return metrics

    def drift(self, rollout: Rollout) -> dict[str, float]:
        """How far the policy moved from the initial one (flowrl.trainer.drift), every ``trainer.kl_every``
        iterations and after the last."""
        every = self.cfg.kl_every
        reference = self.policy.reference
        if not every or reference is no_reference or (self.step % every and not self.finished()):
            return {}
        self.backbone.module.eval()
        kernel, cond = self.schedule.kernel, rollout.cond
        return policy_drift(self.backbone, kernel, self.schedule, cond, rollout.transitions, reference)

    def evaluate(self) -> dict[str, float]:
        """Held-out figures of the current policy (flowrl.trainer.heldout), keys ``eval/...``; the sample row
        goes to ``samples/step_N.png`` (flowrl report)."""
        return self.heldout.evaluate(self.run_dir / "samples" / f"step_{self.step:06d}.png", self.step)

    def score(self, rollout: Rollout) -> RewardBatch:
        """Every reward's scores of the rollout, weighted as at this iteration (a scheduled weight's value at
        ``self.step``); those the sampler declares it computed already (an overlapped rollout's:
        RolloutSampler.precomputed_scores) are taken as they are."""
        return self.parts.rewards(rollout, self.sampler, self.step)

    def update(self, rollout: Rollout, advantages: Advantages, rewards: RewardBatch) -> dict[str, float]:
        """The policy update of this iteration (flowrl.trainer.update), through the graphs the rollout kept."""
        return self.updater(rollout, advantages, rewards, self.step, self.retention.take())

    @property
    def skipped(self) -> int:
        """Iterations skipped for NaN or inf so far."""
        return self.updater.skipped

    @property
    def updates(self) -> int:
        """Optimizer steps taken since this process started (or resumed) the run."""
        return self.updater.updates

    # -- checkpoints (flowrl.trainer.checkpoints.saving) -----------------------------------------------------
    def best_figure(self, figures: dict[str, Any], key: str | None = None) -> tuple[str, float]:
        """The key and value of ``trainer.keep_best``'s figure (or of ``key``) in ``figures``."""
        return best_figure(figures, self.cfg.keep_best, key)

    def keep_best(self, metrics: dict[str, Any]) -> None:
        """Write ``checkpoints/best`` when this evaluation beats every earlier one; the initial policy's
        evaluation writes it first, so a run that never improved keeps its initial weights there."""
        key, value = self.best_figure(metrics)
        if key and value > self.best_value:
            self.best_value = value
            self.checkpoints.save_best(self.counters(), key, value)

    def counters(self) -> dict[str, Any]:
        """What a checkpoint keeps of the loop's progress."""
        return {"step": self.step, "nfe": self.nfe, "rows": self.rows, "wall_s": self.wall, "skipped": self.skipped,
                "best_value": self.best_value}

    def save(self) -> Path | None:
        return self.checkpoints.save(self.counters())

    def _resume(self, folder: Path) -> None:
        c = self.checkpoints.resume(folder)
        self.step, self.nfe, self.wall, self.rows = c["step"], c["nfe"], c["wall_s"], c["rows"]
        self.updater.restore(c["skipped"])
        self.best_value = c["best_value"]


def train(recipe: Recipe, run_dir: RunFolder | Path, resume: Path | None = None, quiet: bool = False) -> Path:
    """Train ``recipe`` into ``run_dir`` (resuming from a run or checkpoint folder if given)."""
    return Trainer(recipe, run_dir, resume=resume, quiet=quiet).run()
