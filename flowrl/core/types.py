"""The typed batches that flow between parts: a plan, a rollout, rewards, advantages.

Components see data only through these objects. A method that needs more data than these fields carries
it in ``Rollout.extras`` with its own gather rule (:mod:`flowrl.core.extras`); the trainer never inspects a
component's name and a new method needs no field here.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch
from torch import Tensor

from flowrl.core.extras import Extra


@attrs.frozen
class Unit:
    """One stochastic (SDE) transition: a jump from step ``start`` over ``merge`` grid steps.

    ``merge = 1`` is an ordinary SDE step; ``merge > 1`` merges steps ``start .. start + merge`` into one
    Euler-Maruyama jump (E-GRPO). The trajectory resumes at step ``end = start + merge``.
    """

    start: int
    merge: int = 1

    @property
    def end(self) -> int:
        return self.start + self.merge


@attrs.frozen
class Schedule:
    """The noise levels ``sigmas[0] = 1 > ... > sigmas[N] = 0`` of one sampling run and its SDE kernel."""

    sigmas: tuple[float, ...]
    kernel: Any  # TransitionKernel; typed loosely to avoid an import cycle

    @property
    def num_steps(self) -> int:
        return len(self.sigmas) - 1

    def tensor(self) -> Tensor:
        return torch.tensor(self.sigmas, dtype=torch.float32)

    @property
    def s_at_one(self) -> float:
        """The grid's second value, used where ``1 - s`` would be 0 at ``s = 1`` (Flow-GRPO's guard)."""
        return self.sigmas[1]


@attrs.define
class Plan:
    """What the selector decided for one iteration: the SDE units and which of them are trained.

    Steps not covered by a unit are deterministic ODE steps. ``trained`` indexes ``units``.
    ``group_sizes`` (optional, one per prompt) overrides the sampler's fixed group size: an allocator
    (AEGPO) gives some prompts more rollouts than others.
    """

    units: tuple[Unit, ...]
    trained: tuple[int, ...]
    info: dict[str, Any] = attrs.field(factory=dict)
    group_sizes: tuple[int, ...] | None = None

    def sizes(self, num_prompts: int, default: int) -> list[int]:
        """Rollouts per prompt: ``group_sizes`` if set, else ``default`` for every prompt."""
        if self.group_sizes is None:
            return [default] * num_prompts
        if len(self.group_sizes) != num_prompts:
            raise ValueError(f"plan has {len(self.group_sizes)} group sizes for {num_prompts} prompts")
        return list(self.group_sizes)

    def __attrs_post_init__(self) -> None:
        ends = [u.start for u in self.units]
        if ends != sorted(ends):
            raise ValueError(f"plan units must be ordered by start step: {self.units}")
        if any(not 0 <= t < len(self.units) for t in self.trained):
            raise ValueError(f"trained indices {self.trained} out of range for {len(self.units)} units")

    def check(self, num_steps: int) -> None:
        """Raise :class:`PlanError` unless every unit lies inside a schedule of ``num_steps`` steps
        (``0 <= start``, ``merge >= 1``, ``end <= num_steps``), no two units overlap, and every group size
        is at least 1. The sampler's walk would otherwise skip a stray unit silently and train less."""
        previous: Unit | None = None
        for unit in self.units:
            if unit.start < 0 or unit.merge < 1 or unit.end > num_steps:
                raise PlanError(f"unit {unit} lies outside the schedule's steps 0..{num_steps - 1}")
            if previous is not None and unit.start < previous.end:
                raise PlanError(f"units {previous} and {unit} overlap")
            previous = unit
        if self.group_sizes is not None and min(self.group_sizes, default=1) < 1:
            raise PlanError(f"group sizes must be at least 1, got {self.group_sizes}")

    def finish_by_ode(self, num_steps: int) -> Plan:
        """This plan with its last unit dropped when that unit ends at step ``num_steps`` (noise level 0) and
        is not trained: the step to 0 is then the Euler ODE step, which lands on the clean estimate
        ``x - s v``, so noise that nothing is trained on never reaches the reward. A trained last unit stays."""
        if not self.units or self.units[-1].end != num_steps or len(self.units) - 1 in self.trained:
            return self
        return attrs.evolve(self, units=self.units[:-1])

    def unit_at(self, step: int) -> Unit | None:
        for unit in self.units:
            if unit.start == step:
                return unit
        return None


class PlanError(ValueError):
    """A selector returned a plan that does not fit the schedule (a bug in the selector, not in the recipe)."""


@attrs.define
class Conditioning:
    """Backbone-specific prompt conditioning, one row per prompt; ``take`` selects rows."""

    tensors: dict[str, Tensor]

    def take(self, index: Tensor) -> Conditioning:
        return Conditioning({k: v.index_select(0, index.to(v.device)) for k, v in self.tensors.items()})

    def __len__(self) -> int:
        return next(iter(self.tensors.values())).shape[0]


@attrs.define
class Transitions:
    """The trained transitions of a rollout.

    Inputs are stored once per distinct (latent, step): when G rollouts leave the same latent (E-GRPO's
    shared anchor), one transformer forward at training time serves all of them. Transition ``t`` starts
    from ``inputs[input_index[t]]`` at noise level ``input_s[input_index[t]]`` and lands on ``x_next[t]``
    at ``s_next[t]``, with old log-density ``log_prob[t]`` (fp32, averaged over dimensions).
    """

    inputs: Tensor  # (I, *latent)
    input_s: Tensor  # (I,)
    input_cond: Tensor  # (I,) long: prompt row in Rollout.cond
    input_index: Tensor  # (T,) long
    s_next: Tensor  # (T,)
    x_next: Tensor  # (T, *latent)
    log_prob: Tensor  # (T,)
    rollout_index: Tensor  # (T,) long: whose advantage trains this transition
    unit_index: Tensor  # (T,) long: index into Plan.units
    weight: Tensor  # (T,) per-transition loss weight (1 unless a method weights steps)
    # (T,) long, optional: the node this transition lands on, for samplers whose rollouts share nodes (a tree,
    # described in Rollout.extras). When set, the transition is trained with that node's advantage
    # (Advantages.nodes) instead of a rollout's.
    node_index: Tensor | None = None

    def __len__(self) -> int:
        return int(self.input_index.shape[0])

    @property
    def num_inputs(self) -> int:
        return int(self.inputs.shape[0])

    @staticmethod
    def concat(parts: list[Transitions]) -> Transitions:
        """Join transitions, re-basing each part's input indices."""
        if not parts:
            raise ValueError("no transitions to concatenate")
        offset, shifted = 0, []
        for part in parts:
            shifted.append(part.input_index + offset)
            offset += part.num_inputs
        nodes = [p.node_index for p in parts if p.node_index is not None]
        if nodes and len(nodes) != len(parts):
            raise ValueError("cannot concatenate transitions with and without node_index")
        return Transitions(
            inputs=torch.cat([p.inputs for p in parts]),
            input_s=torch.cat([p.input_s for p in parts]),
            input_cond=torch.cat([p.input_cond for p in parts]),
            input_index=torch.cat(shifted),
            s_next=torch.cat([p.s_next for p in parts]),
            x_next=torch.cat([p.x_next for p in parts]),
            log_prob=torch.cat([p.log_prob for p in parts]),
            rollout_index=torch.cat([p.rollout_index for p in parts]),
            unit_index=torch.cat([p.unit_index for p in parts]),
            weight=torch.cat([p.weight for p in parts]),
            node_index=torch.cat(nodes) if nodes else None,
        )


@attrs.define
class Rollout:
    """A batch of generated images with the structure the estimator and the loss need.

    ``group[r]`` names the set of rollouts that rollout ``r`` is normalised against (a prompt for
    independent sampling, a (prompt, unit) pair for E-GRPO). ``nfe`` counts transformer evaluations.
    ``extras`` holds a method's own data by name, each value declaring how processes' pieces join
    (:mod:`flowrl.core.extras`): the estimator of a multi-process run sees them gathered like the rest.
    """

    prompts: list[str]  # P distinct prompts
    cond: Conditioning  # P rows
    images: Tensor  # (R, 3, H, W) in [0, 1]; a video backbone's clips: (R, F, 3, H, W)
    rollout_prompt: Tensor  # (R,) long
    group: Tensor  # (R,) long
    transitions: Transitions
    nfe: int
    final_latents: Tensor | None = None  # (R, *latent): clean latents x0 (forward-process losses need them)
    extras: dict[str, Extra] = attrs.field(factory=dict)

    @property
    def num_rollouts(self) -> int:
        return int(self.images.shape[0])

    def rollout_texts(self) -> list[str]:
        return [self.prompts[int(i)] for i in self.rollout_prompt]


@attrs.define
class RewardBatch:
    """Named reward scores per rollout and their weights; ``total`` is the weighted sum."""

    scores: dict[str, Tensor]
    weights: dict[str, float]

    @property
    def total(self) -> Tensor:
        return sum(self.weights[k] * v for k, v in self.scores.items())  # type: ignore[return-value]


@attrs.define
class Advantages:
    """One advantage per rollout, plus the per-reward advantages for logging.

    Estimators of samplers whose rollouts share nodes (a tree) also give one advantage per node in ``nodes``;
    transitions that carry a ``node_index`` are trained with ``nodes[node_index]`` (see
    :func:`transition_advantages`). With several processes every process must hold the same number of nodes.
    """

    values: Tensor  # (R,)
    per_reward: dict[str, Tensor] = attrs.field(factory=dict)
    nodes: Tensor | None = None  # (M,) per-node advantages (node-sharing samplers' estimators)


def transition_advantages(transitions: Transitions, values: Tensor, nodes: Tensor | None = None) -> Tensor:
    """The advantage that trains each transition: its node's (``nodes[node_index]``) when the transitions
    index tree nodes, else its rollout's (``values[rollout_index]``)."""
    if transitions.node_index is None:
        return values[transitions.rollout_index]
    if nodes is None:
        raise ValueError(
            "the sampler's transitions index tree nodes (Transitions.node_index) but the advantage estimator "
            "gave no per-node advantages (Advantages.nodes); use a tree estimator such as 'branch_depthwise'"
        )
    return nodes[transitions.node_index]


@attrs.define
class StepOutput:
    """One kernel transition: the next latent, the Gaussian's mean and std, and the log-density."""

    next: Tensor
    mean: Tensor
    std: Tensor
    log_prob: Tensor


@attrs.define
class LossInputs:
    """What a policy loss sees for a minibatch of transitions (all fp32)."""

    log_prob: Tensor
    old_log_prob: Tensor
    advantages: Tensor
    weight: Tensor
    mean: Tensor
    std: Tensor
    ref_mean: Tensor | None = None
    dt: Tensor | None = None  # s_next - s of each transition (negative)
    old_mean: Tensor | None = None  # the rollout-time policy's mean (when the loss declares needs_old_mean)


@attrs.define
class ForwardProcessInputs:
    """What a forward-process loss (DiffusionNFT) sees: rollouts re-noised at times ``t``.

    ``x_t = (1 - t) x0 + t eps``; ``v`` is the current policy's velocity at ``(x_t, t)`` (with grad),
    ``v_old`` the rollout-time policy's (no grad; a lagged copy's when the loss asks for one,
    ``ForwardProcessLoss.lagged_decay``), ``v_ref`` the reference policy's when the loss needs it.
    """

    x0: Tensor
    x_t: Tensor
    t: Tensor
    v: Tensor
    v_old: Tensor
    advantages: Tensor
    v_ref: Tensor | None = None
    group: Tensor | None = None  # (B,) long: each rollout's prompt; a micro-batch never splits a prompt's rollouts
    draw: Tensor | None = None  # (B,) long: each row's noise draw (ForwardProcessLoss.rows); equal ids share t and eps
