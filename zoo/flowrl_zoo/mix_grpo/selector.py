"""MixGRPO's sliding window: SDE (and training) inside a window of w steps, ODE outside it."""

from __future__ import annotations

import math
from typing import Any, Literal

import attrs
import torch
from attrs.validators import ge, gt, le

from flowrl import Plan, Schedule, TimestepSelector, Unit, register

Strategy = Literal["progressive", "decay", "exp_decay", "random", "frozen"]


@register("selector", "mix_grpo_window")
class MixGRPOWindow(TimestepSelector):
    """MixGRPO sliding window of ``window_size`` SDE steps, all trained; ODE elsewhere (arXiv 2507.21802, Sec. 3).

    The window ``[l, l + w)`` lives inside the first ``L = ceil(span N)`` steps, so ``l`` ranges over
    ``0 .. L - w``. Strategies (``l_0 = start``):

    - ``progressive``: the window holds for ``tau = shift_every`` iterations, then ``l <- l + stride``;
      when ``l + w`` would pass ``L`` it wraps around to ``l = 0``. With ``stride < w`` consecutive
      windows overlap by ``w - stride`` steps; ``stride = w`` tiles the range without overlap.
    - ``decay``: as progressive, but the hold time shrinks linearly with the window position,
      ``tau(l) = max(min_shift_every, ceil(tau (1 - decay * max(0, l - decay_after))))``: later (less noisy)
      windows are trained for fewer iterations.
    - ``exp_decay``: ``tau(l) = max(min_shift_every, ceil(tau exp(-decay * max(0, l - decay_after))))``.
    - ``random``: ``l`` drawn uniformly from ``0 .. L - w`` at every iteration (from the plan generator).
    - ``frozen``: ``l = start`` always.

    The window position and how long it has been held are the selector's state (saved in checkpoints);
    without a saved state the deterministic strategies replay the schedule from iteration 0, so
    ``plan(k)`` is a function of ``k`` alone.
    """

    @attrs.frozen
    class Config:
        window_size: int = attrs.field(default=4, validator=ge(1))  # w: SDE steps in the window
        strategy: Strategy = "progressive"
        shift_every: int = attrs.field(default=25, validator=ge(1))  # tau: iterations per window position
        stride: int = attrs.field(default=1, validator=ge(1))  # steps the window moves per shift
        start: int = attrs.field(default=0, validator=ge(0))  # l_0: initial window start
        span: float = attrs.field(default=1.0, validator=[gt(0), le(1)])  # window stays in the first ceil(span N)
        decay: float = attrs.field(default=0.1, validator=ge(0))  # relative decay of tau per position
        decay_after: int = attrs.field(default=0, validator=ge(0))  # positions before the decay starts
        min_shift_every: int = attrs.field(default=1, validator=ge(1))  # floor of the decayed tau

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self._reset()

    def _reset(self) -> None:
        self.iteration = -1  # the last planned iteration
        self.position = self.config.start  # window start l
        self.held = 0  # iterations planned at this position

    @staticmethod
    def limits(config: Config, num_steps: int) -> tuple[int, int]:
        """``(L, l_max)``: the range length and the last window start."""
        limit = min(num_steps, math.ceil(config.span * num_steps - 1e-9))
        return limit, limit - config.window_size

    @staticmethod
    def check_steps(config: Config, num_steps: int) -> list[tuple[str, str]]:
        limit, last = MixGRPOWindow.limits(config, num_steps)
        if last < 0:
            return [("window_size", f"a window of {config.window_size} steps does not fit in {limit} steps")]
        if config.start > last:
            return [("start", f"the window can start at steps 0..{last}, got {config.start}")]
        return []

    def hold(self, position: int) -> int:
        """``tau(l)``: iterations the window stays at position ``l``."""
        c = self.config
        over = max(0, position - c.decay_after)
        if c.strategy == "decay":
            return max(c.min_shift_every, math.ceil(c.shift_every * (1.0 - c.decay * over) - 1e-9))
        if c.strategy == "exp_decay":
            return max(c.min_shift_every, math.ceil(c.shift_every * math.exp(-c.decay * over) - 1e-9))
        return c.shift_every

    def _tick(self, last: int) -> None:
        """Advance the state by one iteration."""
        if self.iteration >= 0 and self.config.strategy != "frozen" and self.held >= self.hold(self.position):
            nxt = self.position + self.config.stride
            self.position = nxt if nxt <= last else 0
            self.held = 0
        self.held += 1
        self.iteration += 1

    def plan(self, schedule: Schedule, iteration: int, generator: torch.Generator) -> Plan:
        problems = self.check_steps(self.config, schedule.num_steps)
        if problems:
            raise ValueError(f"mix_grpo_window: {problems[0][1]}")
        _, last = self.limits(self.config, schedule.num_steps)
        if self.config.strategy == "random":
            self.position = int(torch.randint(0, last + 1, (1,), generator=generator))
            self.iteration, self.held = iteration, 1
        else:
            if iteration < self.iteration:
                self._reset()
            while self.iteration < iteration:
                self._tick(last)
        w = self.config.window_size
        units = tuple(Unit(i) for i in range(self.position, self.position + w))
        return Plan(units=units, trained=tuple(range(w)), info={"window": (self.position, self.position + w)})

    def state_dict(self) -> dict[str, Any]:
        return {"iteration": self.iteration, "position": self.position, "held": self.held}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            self.iteration, self.position = int(state["iteration"]), int(state["position"])
            self.held = int(state["held"])
