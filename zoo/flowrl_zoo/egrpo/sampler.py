"""E-GRPO's multi-granularity rollouts: the shared-anchor sampler with every jump finished on several ODE grids."""

from __future__ import annotations

import attrs
import torch
from torch import Tensor

from flowrl import Backbone, Plan, Rollout, Schedule, register
from flowrl.core.contracts import needs
from flowrl.core.extras import PerRollout, RolloutIds
from flowrl.core.rng import RolloutRNG
from flowrl.core.types import Conditioning
from flowrl.parts.samplers.anchor_branch import AnchorBranchSampler
from flowrl.parts.samplers.solvers import euler
from flowrl.parts.samplers.untrained import untrained_forwards
from flowrl_zoo.egrpo.advantage import BRANCH, GRANULARITY


def _strides(value: object) -> tuple[int, ...]:
    return tuple(int(v) for v in value)  # type: ignore[attr-defined]


def _check_strides(_instance: object, _attr: object, value: tuple[int, ...]) -> None:
    if not value or any(v < 1 for v in value) or len(set(value)) != len(value):
        raise ValueError(f"granularities must be distinct strides >= 1, at least one, got {list(value)}")


def stride_grid(num_steps: int, start: int, stride: int) -> list[int]:
    """Grid indices ``start, start + stride, ...`` and always ``num_steps`` (noise level 0) last."""
    if start >= num_steps:
        return [num_steps]
    return [*range(start, num_steps, stride), num_steps]


def stride_tail(
    backbone: Backbone, x: Tensor, cond: Conditioning, schedule: Schedule, start: int, stride: int
) -> Tensor:
    """Finish every row by Euler ODE steps from grid step ``start`` to ``s = 0`` on :func:`stride_grid` (one
    evaluation per interval: ``ceil((N - start) / stride)``); never a trained input."""
    index = torch.tensor(stride_grid(schedule.num_steps, start, stride), device=x.device)
    sigmas = schedule.tensor().to(x.device)[index]
    n = x.shape[0]

    def velocity(latents: Tensor, s: Tensor) -> Tensor:
        with untrained_forwards():
            return backbone.velocity(latents, s.expand(n), cond)

    return euler(velocity, x, sigmas)


@register("sampler", "egrpo_granular")
class GranularAnchorBranch(AnchorBranchSampler):
    """E-GRPO rollouts scored at several granularities (arXiv 2601.00423): every jump finished K times by ODE.

    The ``anchor_branch`` sampler (one ODE anchor per prompt, G jumps per trained unit), except that every jump
    is finished once per entry of ``granularities``: an Euler ODE tail from the jump's end ``i + m`` over every
    ``k``-th grid point (``k = 1``: the full grid), to ``s = 0``. The rollouts are the K x G images of each (prompt,
    unit), all in the unit's group; ``extras['granularity']`` says which tail finished an image and
    ``extras['branch']`` which jump. Each jump is one trained transition (recorded once, with the first
    granularity's image), trained with the ``egrpo_granular`` estimator's sum over its K images. A jump's tails
    cost ``sum_k ceil((N - i - m) / k)`` evaluations.
    """

    provides = frozenset({"granular_rollouts"})
    requires = (
        needs(
            "granular_advantages",
            "every jump is finished once per granularity, so each (prompt, unit) group holds K images of every"
            " jump, which a per-image estimator would rank against each other; use the egrpo_granular estimator",
        ),
    )

    @attrs.frozen
    class Config(AnchorBranchSampler.Config):
        # strides of the ODE tail grids after each jump (1: every grid step); the official setting is [1, 2]
        granularities: tuple[int, ...] = attrs.field(default=(1, 2), converter=_strides, validator=_check_strides)

    @staticmethod
    def check_config(config: Config) -> list[tuple[str, str]]:
        if config.tail_steps != 0 or config.tail_solver != "euler":
            return [("granularities", "the granularities set the tails' grids (Euler, a stride each); leave"
                                      " tail_steps = 0 and tail_solver = 'euler'")]
        return []

    def rollout_count(self, plan: Plan, num_prompts: int) -> int:
        """Every jump's image once per granularity."""
        return len(self.config.granularities) * super().rollout_count(plan, num_prompts)

    def rollout(
        self, backbone: Backbone, prompts: list[str], plan: Plan, schedule: Schedule, rng: RolloutRNG
    ) -> Rollout:
        nfe0 = backbone.nfe
        first = super().rollout(backbone, prompts, plan, schedule, rng)  # finished at granularities[0]
        t, r = first.transitions, first.num_rollouts
        if not torch.equal(t.rollout_index.cpu(), torch.arange(r)):
            raise AssertionError("anchor_branch records one transition per rollout, in rollout order")
        ends = torch.tensor([plan.units[int(k)].end for k in t.unit_index])
        cond = first.cond.take(first.rollout_prompt)
        later = [self._tails(backbone, t.x_next, ends, cond, schedule, s) for s in self.config.granularities[1:]]
        k = len(self.config.granularities)
        unit = first.extras["unit"]
        assert isinstance(unit, PerRollout) and first.final_latents is not None
        return Rollout(
            prompts=first.prompts,
            cond=first.cond,
            images=torch.cat([first.images, *(backbone.decode(x) for x in later)]),
            rollout_prompt=first.rollout_prompt.repeat(k),
            group=first.group.repeat(k),
            transitions=t,  # indexes the first granularity's images, 0 .. r - 1
            nfe=backbone.nfe - nfe0,
            final_latents=torch.cat([first.final_latents, *later]),
            extras={
                "unit": PerRollout(unit.value.repeat(k)),
                GRANULARITY: PerRollout(torch.arange(k).repeat_interleave(r)),
                BRANCH: RolloutIds(torch.arange(r).repeat(k)),
            },
        )

    def finish(
        self, backbone: Backbone, tails: list[Tensor], starts: list[int], cond: Conditioning, schedule: Schedule
    ) -> Tensor:
        """The first granularity's tails (the full grid's batched Euler tails when it is 1)."""
        stride = self.config.granularities[0]
        if stride == 1:
            return super().finish(backbone, tails, starts, cond, schedule)
        return torch.cat([stride_tail(backbone, x, cond, schedule, s, stride) for x, s in zip(tails, starts,
                                                                                               strict=True)])

    @staticmethod
    def _tails(
        backbone: Backbone, x: Tensor, ends: Tensor, cond: Conditioning, schedule: Schedule, stride: int
    ) -> Tensor:
        """Every jump's latent ``x[j]`` (at grid step ``ends[j]``) finished on the stride grid, unit by unit."""
        out = torch.empty_like(x, dtype=torch.float32)
        for end in torch.unique(ends).tolist():
            rows = (ends == end).nonzero().flatten()
            out[rows.to(x.device)] = stride_tail(
                backbone, x[rows.to(x.device)], cond.take(rows), schedule, int(end), stride
            ).float()
        return out
