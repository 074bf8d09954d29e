"""The update's micro-batches: each one's loss from the recorded transitions (log-densities recomputed) or from
re-noised rollouts (forward-process losses). The caller (:mod:`flowrl.trainer.update`) backpropagates and steps."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import torch
from torch import Tensor

from flowrl.core.interfaces import Backbone, ForwardProcessLoss, PolicyLoss, TransitionKernel
from flowrl.core.types import (
    Conditioning,
    ForwardProcessInputs,
    LossInputs,
    Rollout,
    Schedule,
    Transitions,
    transition_advantages,
)


def input_chunks(transitions: Transitions, batch_inputs: int) -> Iterator[tuple[Tensor, Tensor]]:
    """Micro-batches of distinct inputs, each with the transitions that start from them.

    Yields ``(input_ids, transition_ids)``; every transition appears in exactly one chunk.
    """
    order = torch.arange(transitions.num_inputs)
    for start in range(0, transitions.num_inputs, batch_inputs):
        ids = order[start : start + batch_inputs]
        mask = (transitions.input_index >= ids[0]) & (transitions.input_index <= ids[-1])
        yield ids, mask.nonzero().flatten()


def transition_losses(
    backbone: Backbone,
    kernel: TransitionKernel,
    loss_fn: PolicyLoss,
    schedule: Schedule,
    cond: Conditioning,
    transitions: Transitions,
    advantages: Tensor,
    batch_inputs: int,
    reference: Callable[[], AbstractContextManager[None]] | None = None,
    node_advantages: Tensor | None = None,
    velocity: Callable[[Tensor, Tensor, Conditioning], Tensor] | None = None,
    old_means: dict[int, Tensor] | None = None,
) -> Iterator[tuple[Tensor, float, dict[str, float]]]:
    """For each micro-batch: (loss, share of all transitions, stats). The caller backpropagates.

    One transformer forward per distinct input serves every transition that starts from it.
    ``reference`` is a context manager factory under which the backbone is the reference policy.
    ``advantages`` has one value per rollout; ``node_advantages`` (tree estimators) one per tree node, used
    for transitions that carry a ``node_index`` (:func:`flowrl.core.types.transition_advantages`).
    ``velocity`` (default: the backbone's) gives the policy's velocity with gradients: the recompute-free
    update passes the rollout's retained ones (:mod:`flowrl.trainer.retain`).
    ``old_means`` (for losses that declare ``needs_old_mean``): micro-batch index -> the transitions' means
    detached; empty at the first inner epoch (before any optimizer step: the rollout-time policy's), filled
    then and read by the later epochs.
    """
    velocity = velocity or backbone.velocity
    total = len(transitions)
    per_transition = transition_advantages(transitions, advantages, node_advantages)
    device = transitions.inputs.device
    for chunk, (input_ids, t_ids) in enumerate(input_chunks(transitions, batch_inputs)):
        if len(t_ids) == 0:
            continue
        x = transitions.inputs[input_ids]
        s = transitions.input_s[input_ids]
        c = cond.take(transitions.input_cond[input_ids])
        v = velocity(x, s, c)
        local = transitions.input_index[t_ids] - input_ids[0]
        s_next = transitions.s_next[t_ids]
        mean, std = kernel.mean_std(x[local].float(), v[local], s[local], s_next, schedule.s_at_one)
        ref_mean = None
        if loss_fn.needs_reference and reference is not None:
            with torch.no_grad(), reference():
                v_ref = backbone.velocity(x, s, c)
            ref_mean = kernel.mean_std(x[local].float(), v_ref[local], s[local], s_next, schedule.s_at_one)[0]
        old_mean = None
        if loss_fn.needs_old_mean:
            cache = {} if old_means is None else old_means
            old_mean = cache.setdefault(chunk, mean.detach().clone())
        batch = LossInputs(
            log_prob=kernel.log_prob(transitions.x_next[t_ids], mean, std),
            old_log_prob=transitions.log_prob[t_ids].to(device),
            advantages=per_transition[t_ids].to(device),
            weight=transitions.weight[t_ids].to(device),
            mean=mean,
            std=std,
            ref_mean=ref_mean,
            dt=s_next - s[local],
            old_mean=old_mean,
        )
        loss, stats = loss_fn(batch)
        yield loss, len(t_ids) / total, stats


def prompt_chunks(prompt: Tensor, batch_rollouts: int) -> Iterator[Tensor]:
    """Row ranges of at most ``batch_rollouts`` rows that never split a run of equal ``prompt`` values (a run
    longer than ``batch_rollouts`` is a chunk of its own); together they cover every row once, in order."""
    total = int(prompt.shape[0])
    changes = (torch.nonzero(prompt[1:] != prompt[:-1]).flatten() + 1).tolist()
    starts = [0, *changes, total]
    begin = 0
    for a, b in zip(starts[:-1], starts[1:], strict=True):
        if b - begin > batch_rollouts and a > begin:
            yield torch.arange(begin, a)
            begin = a
    if begin < total:
        yield torch.arange(begin, total)


def forward_process_losses(
    backbone: Backbone,
    loss_fn: ForwardProcessLoss,
    rollout: Rollout,
    advantages: Tensor,
    batch_rollouts: int,
    generator: torch.Generator,
    reference: Callable[[], AbstractContextManager[None]] | None = None,
    lagged: Callable[[], AbstractContextManager[None]] | None = None,
) -> Iterator[tuple[Tensor, float, dict[str, float]]]:
    """For forward-process losses: re-noise each loss row's clean latent and yield (loss, share, stats).

    The rows are the loss's (:meth:`ForwardProcessLoss.rows`: by default each rollout, ``levels()`` times): one
    time and one noise are drawn per draw id and shared by its rows. Micro-batches keep each prompt's rows together
    (:func:`prompt_chunks`), so a loss may centre within a prompt, and rows that share a draw stay together.
    ``v_old`` is the policy's velocity before this update (one inner epoch: the same forward, detached), or, with
    ``lagged`` (a context under which the transformer holds the lagged copy), the copy's. A process whose loss
    trains no row in this update runs one forward at share 0, so that every process takes part in the gradient's
    all-reduce.
    """
    if rollout.final_latents is None:
        raise ValueError(f"{type(loss_fn).__name__} needs Rollout.final_latents; the sampler did not record them")
    levels = int(loss_fn.levels())
    if levels < 1:
        raise ValueError(f"{type(loss_fn).__name__}.levels() must be at least 1, got {levels}")
    rollout_of, draw = loss_rows(loss_fn, advantages, rollout.rollout_prompt)
    if rollout_of.numel() == 0:
        yield from idle_forward(backbone, rollout)
        return
    x0_all = rollout.final_latents.float()[rollout_of]
    prompt_all, advantages = rollout.rollout_prompt[rollout_of], advantages[rollout_of.to(advantages.device)]
    total, draws = x0_all.shape[0], int(draw[-1]) + 1
    t_all = loss_fn.sample_times(draws, generator)[draw]
    eps_all = torch.randn((draws, *x0_all.shape[1:]), generator=generator)[draw]
    for rows in prompt_chunks(prompt_all, batch_rollouts):
        x0 = x0_all[rows]
        t = t_all[rows].to(x0.device)
        shape = (-1, *([1] * (x0.dim() - 1)))
        x_t = (1 - t.reshape(shape)) * x0 + t.reshape(shape) * eps_all[rows].to(x0.device)
        cond = rollout.cond.take(prompt_all[rows])
        v_lagged = None
        if lagged is not None:  # before the forward with gradients: the swap writes the weights in place
            with torch.no_grad(), lagged():
                v_lagged = backbone.velocity(x_t, t, cond)
        v = backbone.velocity(x_t, t, cond)
        v_ref = None
        if loss_fn.needs_reference and reference is not None:
            with torch.no_grad(), reference():
                v_ref = backbone.velocity(x_t, t, cond)
        batch = ForwardProcessInputs(
            x0=x0, x_t=x_t, t=t, v=v, v_old=v.detach() if v_lagged is None else v_lagged,
            advantages=advantages[rows].to(x0.device), v_ref=v_ref, group=prompt_all[rows].to(x0.device),
            draw=draw[rows].to(x0.device),
        )
        loss, stats = loss_fn.forward_process(batch)
        yield loss, len(rows) / total, stats


def loss_rows(loss_fn: ForwardProcessLoss, advantages: Tensor, prompt: Tensor) -> tuple[Tensor, Tensor]:
    """The loss's ``(rollout, draw)`` rows (:meth:`ForwardProcessLoss.rows`), held to its contract: as many draws
    as rows, rollouts in range, draws counting up from 0 without decreasing, rows of one draw on one prompt."""
    name = type(loss_fn).__name__
    rollout, draw = (torch.as_tensor(x).long().cpu().flatten() for x in loss_fn.rows(advantages, prompt.cpu()))
    if rollout.shape != draw.shape:
        raise ValueError(f"{name}.rows gave {rollout.numel()} rollouts but {draw.numel()} draws")
    if rollout.numel() == 0:
        return rollout, draw
    if int(rollout.min()) < 0 or int(rollout.max()) >= int(prompt.shape[0]):
        raise ValueError(f"{name}.rows names a rollout outside 0 .. {int(prompt.shape[0]) - 1}")
    steps = draw[1:] - draw[:-1]
    if int(draw[0]) != 0 or bool(((steps != 0) & (steps != 1)).any()):
        raise ValueError(f"{name}.rows: draw ids must count up from 0 in steps of 0 or 1, got {draw.tolist()[:16]}")
    rows_prompt = prompt.cpu()[rollout]
    if bool(((steps == 0) & (rows_prompt[1:] != rows_prompt[:-1])).any()):
        raise ValueError(f"{name}.rows: rows that share a draw must share a prompt")
    return rollout, draw


def idle_forward(backbone: Backbone, rollout: Rollout) -> Iterator[tuple[Tensor, float, dict[str, float]]]:
    """One forward of the first rollout, as a zero loss at share 0: the update of a process with no row to train
    still reaches the gradient all-reduce (its gradient is zero)."""
    assert rollout.final_latents is not None
    x0 = rollout.final_latents[:1].float()
    t = torch.full((1,), 0.5, device=x0.device)
    v = backbone.velocity(x0, t, rollout.cond.take(rollout.rollout_prompt[:1]))
    yield v.float().sum() * 0.0, 0.0, {}


class StatsMean:
    """Share-weighted means of per-micro-batch statistics."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = defaultdict(float)
        self.weight = 0.0

    def add(self, stats: dict[str, float], share: float) -> None:
        for key, value in stats.items():
            self.sums[key] += float(value) * share
        self.weight += share

    def result(self) -> dict[str, float]:
        return {k: v / self.weight for k, v in self.sums.items()} if self.weight else {}

