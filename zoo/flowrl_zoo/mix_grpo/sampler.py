"""MixGRPO-Flash: independent rollouts whose ODE part after the SDE window uses fewer, higher-order steps."""

from __future__ import annotations

from typing import Literal

import attrs
from attrs.validators import ge
from torch import Tensor

from flowrl import Backbone, Plan, Schedule, register
from flowrl.core.rng import RolloutRNG
from flowrl.core.types import Conditioning
from flowrl.parts.samplers.independent import IndependentSampler
from flowrl.parts.samplers.walk import TrajectoryRecorder, solver_tail, walk


def window_end(plan: Plan) -> int:
    """The grid step after the plan's last SDE unit (0 when the plan is all ODE)."""
    return max((u.end for u in plan.units), default=0)


@register("sampler", "mix_grpo_flash")
class MixGRPOFlashSampler(IndependentSampler):
    """Independent rollouts; after the SDE window a coarser DPM-Solver++ 2M ODE tail (MixGRPO-Flash, 2507.21802).

    G independent trajectories per prompt; after the last SDE unit the ODE is solved on a coarser grid
    (``tail_steps`` intervals) with ``tail_solver``.

    Steps before and inside the window follow the full grid (Euler ODE and the kernel's SDE). The tail
    grid is every ``k``-th point of the sampler's own grid from the window end to ``s = 0`` (see
    :func:`flowrl.parts.samplers.solvers.coarse_grid`); one transformer evaluation per tail interval, so a rollout
    costs ``window_end + tail intervals`` evaluations. ``tail_steps = 0`` keeps the full grid.
    """

    chunkable = False  # trainer.overlap_chunks leaves it whole, as before the declaration (not checked chunked)

    @attrs.frozen
    class Config(IndependentSampler.Config):
        tail_solver: Literal["euler", "dpm_solver_2m"] = "dpm_solver_2m"  # ODE solver after the window
        tail_steps: int = attrs.field(default=0, validator=ge(0))  # intervals after the window; 0: full grid

    def denoise(
        self,
        backbone: Backbone,
        x: Tensor,
        cond: Conditioning,
        rollout_prompt: Tensor,
        plan: Plan,
        schedule: Schedule,
        rng: RolloutRNG,
        recorder: TrajectoryRecorder,
    ) -> Tensor:
        """The full grid up to the end of the SDE window, then the coarse tail."""
        end = window_end(plan)
        x = walk(backbone, x, cond, rollout_prompt, 0, plan, schedule, rng, recorder, stop=end)
        return self.finish(backbone, x, cond, schedule, end)

    def finish(self, backbone: Backbone, x: Tensor, cond: Conditioning, schedule: Schedule, start: int) -> Tensor:
        """Solve the ODE from grid step ``start`` to ``s = 0`` on the coarse tail grid."""
        return solver_tail(backbone, x, cond, schedule, start, self.config.tail_solver, self.config.tail_steps)
