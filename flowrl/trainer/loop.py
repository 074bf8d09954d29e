"""The shared training loop. One iteration, in phases:

    prompts -> plan -> rollout -> rewards -> advantages -> policy update -> log / checkpoint

Every method is this loop with different parts; no method has a trainer of its own.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from flowrl.backbones.lora_export import LORA_FOLDER, export_lora
from flowrl.interfaces import Backbone, ForwardProcessLoss, PolicyLoss
from flowrl.recipe import Recipe
from flowrl.rng import RolloutRNG, generator
from flowrl.trainer.checkpoint import (
    BEST,
    CheckpointError,
    begin_checkpoint,
    find_checkpoint,
    load_checkpoint,
    load_shard,
    rng_state,
    save_checkpoint,
    save_shard,
    set_rng_state,
)
from flowrl.trainer.distributed import global_advantages, reduce_metrics
from flowrl.trainer.drift import policy_drift
from flowrl.trainer.errors import BestMetricError, NonFiniteError, NothingTrainedError, RunInterrupted
from flowrl.trainer.health import HealthAlerts, rollout_health
from flowrl.trainer.logger import RunLogger, write_grid
from flowrl.trainer.memory import check_rollout_fits
from flowrl.trainer.policy import TrainedPolicy
from flowrl.trainer.resume import check_resume, record_resume
from flowrl.trainer.rewards import reward_models, score_rollout
from flowrl.trainer.runfolder import RunFolderError, lock_run_folder
from flowrl.trainer.sharding import check_launch
from flowrl.trainer.support import (
    StopSignal,
    allow_attention_kernels,
    peak_memory_mb,
    plan_scalars,
    seed_everything,
)
from flowrl.trainer.update import StatsMean, forward_process_losses, no_reference, transition_losses
from flowrl.types import Advantages, PlanError, RewardBatch, Rollout, Schedule


class Trainer:
    """Builds every part of a recipe and runs the loop; ``run()`` trains to ``trainer.max_steps``."""

    def __init__(self, recipe: Recipe, run_dir: Path, resume: Path | None = None, quiet: bool = False) -> None:
        from accelerate import Accelerator

        checkpoint = find_checkpoint(resume) if resume is not None else None
        changes = check_resume(checkpoint, recipe) if checkpoint is not None else []  # before anything loads
        self.recipe = recipe
        self.cfg = recipe.trainer
        self.run_dir = Path(run_dir)
        self.quiet = quiet
        self.accelerator = Accelerator(cpu=not torch.cuda.is_available(), mixed_precision=self.cfg.mixed_precision)
        check_launch(str(self.accelerator.distributed_type.value))
        seed_everything(recipe.seed + self.accelerator.process_index)
        if self.cfg.torch_threads:
            torch.set_num_threads(self.cfg.torch_threads)
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
            allow_attention_kernels(self.cfg.attention_kernels)
        # Rewards first: missing weights or extras fail before the backbone loads.
        self.rewards = reward_models(recipe)
        self.prompts = recipe.build("prompts")
        self.selector = recipe.build("selector")
        self.sampler = recipe.build("sampler")
        self.estimator = recipe.build("advantage")
        self.loss_fn = recipe.build("loss")
        kernel = recipe.build("kernel")
        self.backbone: Backbone = recipe.build("backbone")
        self.backbone.to(self.accelerator.device)
        sampler_cfg = self.sampler.config
        sigmas = self.backbone.schedule_sigmas(sampler_cfg.num_steps, sampler_cfg.shift)
        self.schedule = Schedule(sigmas=sigmas, kernel=kernel)
        pixels = int(getattr(self.backbone.config, "resolution", 0)) ** 2
        check_rollout_fits(recipe.source, self.cfg.prompts_per_step, self.sampler.rollouts_per_prompt(),
                           sampler_cfg.num_steps, self.backbone.latent_shape, pixels, self.accelerator.device)
        eval_sigmas = self.backbone.schedule_sigmas(self.cfg.eval_steps, sampler_cfg.shift)
        self.eval_schedule = Schedule(sigmas=eval_sigmas, kernel=kernel)  # ODE only: the kernel is unused
        self.probes_reference = any(getattr(part, "needs_reference", False) for part in (self.selector, self.sampler))
        needs = self.probes_reference or bool(getattr(self.loss_fn, "needs_reference", False))
        self.policy = TrainedPolicy(self.backbone, recipe, self.accelerator, needs)
        self.named_params = self.policy.named_params
        self.reference = self.policy.reference
        self.step = 0
        self.nfe = 0
        self.wall = 0.0
        self.started = time.perf_counter()  # reset when run() starts; trainer.max_minutes counts from there
        self.time_up = False
        self.bad_steps = 0
        self.skipped = 0
        self.updates = 0  # optimizer steps taken since this process started the run (or resumed it)
        self.best_value = -math.inf  # the best value of trainer.keep_best's figure so far (step 0 included)
        self.alerts = HealthAlerts(self.cfg.alert_diversity, self.cfg.alert_eval_falls)
        # One writer per run folder: the lock comes before the checks, so two runs started together cannot
        # both pass them; nothing in the folder is rewritten until every check has passed.
        self._lock = lock_run_folder(self.run_dir) if self.accelerator.is_main_process else None
        try:
            if checkpoint is not None:
                self._resume(checkpoint)
            elif (self.run_dir / "metrics.jsonl").exists():
                raise RunFolderError(
                    f"run folder {self.run_dir} already holds a run (metrics.jsonl); continue it with --resume "
                    "or choose another --output-dir"
                )
            self.logger = RunLogger(self.run_dir, self.accelerator.is_main_process, truncate_after=self.step)
        except BaseException:
            self.release()
            raise
        if self.accelerator.is_main_process:
            if changes and checkpoint is not None:
                tqdm.write(record_resume(self.run_dir, checkpoint, self.step, changes), file=sys.stderr)
            (self.run_dir / "recipe.toml").write_text(recipe.to_toml())

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
        self.started = time.perf_counter()
        first = self.step
        try:
            if self.evaluates and self.step == 0:
                figures = self.evaluate()
                self.logger.log({"step": 0, "wall_s": 0.0, "nfe": 0, **figures})
                self.best_value = self.best_figure(figures)[1]
            while not self.finished():
                nfe = self.nfe
                metrics = self.iteration()
                bar.update(self.nfe - nfe if by_nfe else 1)
                bar.set_postfix(reward=f"{metrics.get('reward/total', float('nan')):.4f}", nfe=self.nfe)
                if self.cfg.checkpoint_every and self.step % self.cfg.checkpoint_every == 0:
                    self.save()
                if stop.received:
                    message = f"{stop.received}: checkpoint written at step {self.step}; resume with --resume"
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
        if stop.received:  # the caller (a shell's `train && eval`) must not go on as if the run had finished
            raise RunInterrupted(stop.received)
        if self.step > first and self.updates == 0:
            n = self.step - first
            raise NothingTrainedError(
                f"the run trained nothing: {n} iteration{'s' if n != 1 else ''}, {self.skipped} skipped for NaN or"
                " inf, the others without a transition to train (check the rewards and the selector's trained units)"
            )
        return self.run_dir

    def release(self) -> None:
        """Give up the run folder's lock (after the last write; another process may then resume the run)."""
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def finished(self) -> bool:
        """The step limit, the NFE budget or the time limit is reached."""
        budget = bool(self.cfg.max_nfe and self.nfe >= self.cfg.max_nfe)
        return self.step >= self.cfg.max_steps or budget or self.time_up

    @property
    def evaluates(self) -> bool:
        """Held-out evaluations are on (by iterations, by NFE or both)."""
        return bool(self.cfg.eval_every or self.cfg.eval_every_nfe)

    def evaluation_due(self, nfe_before: int) -> bool:
        """Evaluate after this iteration: every ``eval_every`` iterations, when this iteration's rollouts took
        the NFE count from ``nfe_before`` across a multiple of ``eval_every_nfe``, and after the last iteration."""
        cfg, every = self.cfg, self.cfg.eval_every_nfe
        by_step = bool(cfg.eval_every) and self.step % cfg.eval_every == 0
        by_nfe = bool(every) and self.nfe // every > nfe_before // every
        return self.evaluates and (by_step or by_nfe or self.finished())

    def _time_is_up(self) -> bool:
        """``trainer.max_minutes`` has passed since ``run`` started (the slowest process decides)."""
        if not self.cfg.max_minutes:
            return False
        elapsed = torch.tensor([time.perf_counter() - self.started], device=self.accelerator.device)
        if self.accelerator.num_processes > 1:
            elapsed = self.accelerator.reduce(elapsed, "max")
        return float(elapsed) >= 60.0 * self.cfg.max_minutes

    def iteration(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        forward0 = self.backbone.forward_s
        step = self.step
        # 1. prompts (this process's slice of the global batch) and plan; every transformer evaluation from
        #    here to the end of the rollout counts towards the NFE (a selector's probes included)
        seed, per, rank = self.recipe.seed, self.cfg.prompts_per_step, self.accelerator.process_index
        everyone = self.prompts.sample(per * self.accelerator.num_processes, generator(seed, step, "prompts"))
        prompts = everyone[rank * per : (rank + 1) * per]
        self.backbone.module.eval()
        nfe0 = self.backbone.nfe
        with torch.no_grad(), self.policy.inference(reference=self.probes_reference):
            self.selector.observe(self.backbone, prompts, self.schedule)
            plan = self.selector.plan(self.schedule, step, generator(seed, step, "plan"))
            try:
                plan.check(self.schedule.num_steps)
            except PlanError as error:
                selector = self.recipe.parts["selector"].type
                raise PlanError(f"selector {selector!r} at iteration {step}: {error}") from None
            # 2. rollout with the current (old) policy
            rng = RolloutRNG(seed, step, range(rank * per, (rank + 1) * per))
            rollout = self.sampler.rollout(self.backbone, prompts, plan, self.schedule, rng)
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
        self.nfe += reduce_metrics(self.accelerator, {"nfe": nfe_iteration}, summed=("nfe",))["nfe"]
        t_iter = time.perf_counter() - t0
        self.wall += t_iter
        self.time_up = self._time_is_up()
        t_model = self.backbone.forward_s - forward0 + update.pop("time/backward_s", 0.0)
        metrics: dict[str, Any] = {f"reward/{k}": float(v.mean()) for k, v in rewards.scores.items()}
        metrics["reward/total"] = float(rewards.total.mean())
        metrics["advantage/abs_mean"] = float(advantages.values.abs().mean())
        metrics.update({f"advantage/{k}/abs_mean": float(v.abs().mean()) for k, v in advantages.per_reward.items()})
        metrics.update(rollout_health(rollout.images, rollout.group, rewards.total))
        metrics.update(update)
        metrics.update(self.drift(rollout))
        metrics.update(plan_scalars(plan))
        metrics.update({"time/rollout_s": t_rollout, "time/update_s": t_update})
        metrics["lr"] = self.policy.lr
        metrics.update(
            {
                "time/iteration_s": t_iter,
                "time/transformer_s": t_model,
                "time/outside_share": max(0.0, 1 - t_model / t_iter),
                "mem/peak_mb": peak_memory_mb(),
            }
        )
        metrics = {
            "step": self.step,
            "wall_s": round(self.wall, 4),
            "nfe": self.nfe,
            **reduce_metrics(self.accelerator, metrics),
            "skipped_steps": self.skipped,
        }
        figure = None
        if self.evaluation_due(nfe_before):
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
        if not every or self.reference is no_reference or (self.step % every and not self.finished()):
            return {}
        self.backbone.module.eval()
        kernel, cond = self.schedule.kernel, rollout.cond
        return policy_drift(self.backbone, kernel, self.schedule, cond, rollout.transitions, self.reference)

    def evaluate(self) -> dict[str, float]:
        """Held-out figures of the current policy (deterministic ODE samples), keys ``eval/...``."""
        from flowrl.evaluate import evaluate

        prompts = self.prompts.heldout()[: self.cfg.eval_prompts]
        if not prompts:
            return {}
        self.backbone.module.eval()
        nfe = self.backbone.nfe
        with self.policy.inference():
            result = evaluate(self.backbone, prompts, self.rewards, self.eval_schedule, self.cfg.eval_seed)
            grid = self._sample_grid() if self.grids_here else None
        if grid is not None and self.accelerator.is_main_process:  # the run's samples over time (flowrl report)
            write_grid(grid, self.run_dir / "samples" / f"step_{self.step:06d}.png")
        self.backbone.nfe = nfe  # evaluation is not part of the training budget
        return {f"eval/{k}": v for k, v in result.items() if k not in ("nfe", "prompts")}

    def score(self, rollout: Rollout) -> RewardBatch:
        return score_rollout(self.rewards, rollout)

    def update(self, rollout: Rollout, advantages: Advantages, rewards: RewardBatch) -> dict[str, float]:
        """Inner epochs over the rollout's transitions; one optimizer step each. Non-finite steps are skipped."""
        result: dict[str, float] = {"loss": 0.0, "clip_frac": 0.0, "grad_norm": 0.0}
        if isinstance(self.loss_fn, PolicyLoss) and len(rollout.transitions) == 0:
            return result
        module = self.backbone.module
        module.train()
        backward_s = 0.0
        for _ in range(self.cfg.inner_epochs):
            self.policy.zero_grad()
            stats = StatsMean()
            total_loss = torch.zeros(())
            for loss, share, batch_stats in self.micro_batches(rollout, advantages):
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

    def micro_batches(self, rollout: Rollout, advantages: Advantages) -> Iterator[tuple[torch.Tensor, float, dict]]:
        """(loss, share, stats) per micro-batch: recorded transitions, or re-noised rollouts (forward process)."""
        if isinstance(self.loss_fn, ForwardProcessLoss):
            nft = generator(self.recipe.seed, self.step, "forward_process", self.accelerator.process_index)
            return forward_process_losses(
                self.backbone, self.loss_fn, rollout, advantages.values, self.cfg.train_batch_size, nft, self.reference
            )
        return transition_losses(
            self.backbone,
            self.schedule.kernel,
            self.loss_fn,
            self.schedule,
            rollout.cond,
            rollout.transitions,
            advantages.values,
            self.cfg.train_batch_size,
            self.reference,
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

    # -- checkpoints ----------------------------------------------------------------------------
    def best_figure(self, figures: dict[str, Any], key: str | None = None) -> tuple[str, float]:
        """The key and value of ``trainer.keep_best``'s figure (or of ``key``) in ``figures`` (``("", -inf)``
        when off)."""
        key = self.cfg.keep_best if key is None else key
        if key == "auto":
            key = next((k for k in ("eval/strict", "eval/score") if k in figures), "")
        if not key:
            return "", -math.inf
        if key not in figures:
            found = ", ".join(sorted(k for k in figures if k.startswith("eval/"))) or "none"
            raise BestMetricError(f"trainer.keep_best = {key!r} is not an evaluation figure of this run ({found})")
        value = float(figures[key])
        return key, value if math.isfinite(value) else -math.inf

    def keep_best(self, metrics: dict[str, Any]) -> None:
        """Write ``checkpoints/best`` when this evaluation beats every earlier one, the initial policy's
        included (so a run that never improved has no best checkpoint)."""
        key, value = self.best_figure(metrics)
        if not key or value <= self.best_value:
            return
        self.best_value = value
        weights = self.policy.weights()  # every process: gathering sharded weights is a collective
        if not self.accelerator.is_main_process:
            return
        folder = self.run_dir / "checkpoints" / BEST
        state = {"step": self.step, "nfe": self.nfe, "wall_s": self.wall, "best": {"figure": key, "value": value}}
        save_checkpoint(folder, weights, state, {}, keep=None)
        (folder / "recipe.toml").write_text(self.recipe.to_toml())

    def save(self) -> Path | None:
        """Write ``checkpoints/step_N`` (the main process; every process takes part when sharded: the weights
        and LoRA are gathered, and each process writes its slice of the optimizer and EMA state)."""
        accelerator, sharded = self.accelerator, self.policy.sharded
        accelerator.wait_for_everyone()
        folder = self.run_dir / "checkpoints" / f"step_{self.step:06d}"
        weights, lora = self.policy.weights(), self.policy.lora_layers()
        bad = self.policy.non_finite(weights)
        if bad:  # never write a checkpoint a NaN has reached
            raise NonFiniteError(f"weights became non-finite ({bad}); no checkpoint written at step {self.step}")
        policy_state = self.policy.state()
        if sharded:
            if accelerator.is_main_process:
                begin_checkpoint(folder)
            accelerator.wait_for_everyone()
            save_shard(folder, accelerator.process_index, {k: policy_state.pop(k) for k in ("optimizer", "ema")})
            accelerator.wait_for_everyone()
        with self.policy.inference():
            grid = self._sample_grid() if self.grids_here else None
        if not accelerator.is_main_process:
            return None
        best = self.best_value if math.isfinite(self.best_value) else None
        state = {"step": self.step, "nfe": self.nfe, "wall_s": self.wall, "skipped": self.skipped, "best_value": best}
        if sharded:
            state["sharded_processes"] = accelerator.num_processes
        extra = {
            **policy_state,
            "rng": rng_state({}),
            "components": {"selector": self.selector.state_dict(), "sampler": self.sampler.state_dict()},
        }
        path = save_checkpoint(folder, weights, state, extra, self.cfg.keep_checkpoints, staged=sharded)
        if lora is not None:  # also in the diffusers format: pipe.load_lora_weights(path / "lora")
            export_lora(self.backbone, path / LORA_FOLDER, layers=lora)
        (path / "recipe.toml").write_text(self.recipe.to_toml())
        if grid is not None:
            write_grid(grid, path / "samples.png")
        return path

    @property
    def grids_here(self) -> bool:
        """This process computes the sample grids: the main one writes them, and when sharded every process
        takes part in the forwards."""
        return bool(self.cfg.image_every) and (self.accelerator.is_main_process or self.policy.sharded)

    def _sample_grid(self) -> tuple[torch.Tensor, list[str]]:
        """Deterministic ODE samples (seed 0) for the first 8 held-out (or training) prompts, and the prompts."""
        from flowrl.evaluate import ode_images

        prompts = (self.prompts.heldout() or self.prompts.sample(8, torch.Generator().manual_seed(0)))[:8]
        return ode_images(self.backbone, prompts, self.eval_schedule, seed=0), prompts

    def _resume(self, folder: Path) -> None:
        weights, state, extra = load_checkpoint(folder)
        if "lr_schedule" not in extra:
            raise CheckpointError(f"checkpoint {folder} holds weights only (a best checkpoint); resume from a step_*")
        written = int(state.get("sharded_processes", 0))
        here = self.accelerator.num_processes if self.policy.sharded else 0
        if written != here:
            was = f"{written} sharded processes" if written else "a run without sharding"
            now = f"with {here} sharded process{'es' if here > 1 else ''}" if here else "without sharding"
            raise CheckpointError(
                f"checkpoint {folder} was written by {was}; it cannot resume {now} (trainer.sharding and the process"
                " count must match the run that wrote it)"
            )
        if written:
            extra.update(load_shard(folder, self.accelerator.process_index, written))
        self.policy.load(weights, extra, folder, self.recipe.optim)
        set_rng_state(extra["rng"], {})
        self.selector.load_state_dict(extra["components"]["selector"])
        self.sampler.load_state_dict(extra["components"]["sampler"])
        self.step, self.nfe, self.wall = state["step"], state["nfe"], state["wall_s"]
        self.skipped = state.get("skipped", 0)
        best = state.get("best_value")
        self.best_value = -math.inf if best is None else float(best)


def train(recipe: Recipe, run_dir: Path, resume: Path | None = None, quiet: bool = False) -> Path:
    """Train ``recipe`` into ``run_dir`` (resuming from a run or checkpoint folder if given)."""
    return Trainer(recipe, run_dir, resume=resume, quiet=quiet).run()
