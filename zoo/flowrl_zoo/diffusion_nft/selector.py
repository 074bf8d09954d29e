"""Rollouts for a forward-process loss: nothing is trained on the sampling transitions."""

from __future__ import annotations

import attrs
import torch

from flowrl import Plan, Schedule, TimestepSelector, Unit, register


@register("selector", "nft_rollouts")
class NFTRollouts(TimestepSelector):
    """Plans for DiffusionNFT (arXiv 2509.16117): no transition is trained (the loss uses the final images).

    ``stochastic = false``: every step is ODE, so each rollout is the deterministic sample of its own initial
    noise. ``stochastic = true``: every step is an SDE step of the recipe's kernel (more diverse groups);
    no transitions are recorded either way.
    """

    @staticmethod
    def provides(config: Config) -> frozenset[str]:
        return frozenset({"no_trained_units", "unit_every_step"} if config.stochastic else {"no_trained_units"})

    @attrs.frozen
    class Config:
        stochastic: bool = False  # SDE at every step (nothing recorded) instead of the ODE

    def plan(self, schedule: Schedule, iteration: int, generator: torch.Generator) -> Plan:
        units = tuple(Unit(i) for i in range(schedule.num_steps)) if self.config.stochastic else ()
        return Plan(units=units, trained=())
