"""The last step, to noise level 0, is the ODE step unless the selector trains it (``[schedule] final_sde``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import shipped_tiny

import flowrl
from flowrl import Plan, Unit
from flowrl.core.rng import RolloutRNG
from flowrl.core.types import Schedule
from flowrl.parts.samplers.walk import walk
from flowrl.trainer import Trainer


@pytest.mark.parametrize(
    ("units", "trained", "kept"),
    [
        ((Unit(0), Unit(1), Unit(2), Unit(3)), (0, 1, 2), 3),  # untrained last step: dropped
        ((Unit(0), Unit(1), Unit(2, 2)), (0, 1), 2),  # an untrained merged unit ending at 0: dropped whole
        ((Unit(0), Unit(1), Unit(2), Unit(3)), (0, 3), 4),  # the selector trains the last step: it stays
        ((Unit(0), Unit(2)), (0,), 2),  # no unit ends at 0: unchanged
        ((), (), 0),
    ],
)
def test_finish_by_ode_drops_only_an_untrained_last_unit(units: tuple, trained: tuple, kept: int) -> None:
    plan = Plan(units=units, trained=trained, info={"x": 1}, group_sizes=None)
    out = plan.finish_by_ode(4)
    assert out.units == units[:kept] and out.trained == trained and out.info == {"x": 1}


def test_the_image_is_the_clean_estimate_of_the_last_input() -> None:
    """With the last unit dropped, the final latent is ``x - s v`` at the last step's input, whatever its noise."""
    backbone = flowrl.build("backbone", {"type": "tiny_flux", "resolution": 16})
    schedule = Schedule(backbone.schedule_sigmas(4, 3.0), flowrl.build("kernel", {"type": "flow_grpo_sde"}))
    cond, rows = backbone.encode(["a red circle", "a dog"]), torch.arange(2)
    x1 = backbone.noise(2, torch.Generator().manual_seed(0))
    full = Plan(units=tuple(Unit(i) for i in range(4)), trained=(0, 1, 2))
    finished = full.finish_by_ode(4)
    with torch.no_grad():
        before_last = walk(backbone, x1, cond, rows, 0, full, schedule, RolloutRNG(0, 0, [0, 1]), stop=3)
        s = torch.full((2,), schedule.sigmas[3])
        clean = before_last - s.reshape(-1, 1, 1) * backbone.velocity(before_last, s, cond)
        ode_end = walk(backbone, x1, cond, rows, 0, finished, schedule, RolloutRNG(0, 0, [0, 1]))
        sde_end = walk(backbone, x1, cond, rows, 0, full, schedule, RolloutRNG(0, 0, [0, 1]))
    torch.testing.assert_close(ode_end, clean, rtol=1e-5, atol=1e-6)
    # the stochastic last step moves the image away from it by about that step's std
    std = schedule.kernel.mean_std(before_last, before_last, s, torch.zeros(2), schedule.s_at_one)[1]
    assert float((sde_end - clean).std()) > 0.5 * float(std[0]) > 0


@pytest.mark.parametrize(("final_sde", "last_is_sde"), [(False, False), (True, True)])
def test_the_trainer_applies_the_rule(tmp_path: Path, final_sde: bool, last_is_sde: bool) -> None:
    """Flow-GRPO's recipe plans every step stochastic and trains all but the last: the sampler gets a plan
    without the last unit by default, and the selector's own plan with ``final_sde = true``."""
    recipe = shipped_tiny("flow_grpo", [f"schedule.final_sde={str(final_sde).lower()}", "trainer.max_steps=1"])
    trainer = Trainer(recipe, tmp_path / "run", quiet=True)
    seen: list[Plan] = []
    real = trainer.sampler.rollout

    def recorded(backbone, prompts, plan, schedule, rng):  # type: ignore[no-untyped-def]
        seen.append(plan)
        return real(backbone, prompts, plan, schedule, rng)

    trainer.sampler.rollout = recorded  # type: ignore[method-assign]
    trainer.run()
    n = recipe.schedule.num_steps
    assert len(seen) == 1
    assert (seen[0].unit_at(n - 1) is not None) is last_is_sde
    assert seen[0].trained == tuple(range(int(n * 0.99)))
