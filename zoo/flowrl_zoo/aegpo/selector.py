"""AEGPO's local exploration (arXiv 2602.06825): SDE steps where the attention entropy Entropy(t) peaks."""

from __future__ import annotations

from typing import Any, Literal

import attrs
import torch
from attrs.validators import ge

from flowrl import Backbone, Plan, Schedule, TimestepSelector, Unit, register
from flowrl.backbones.common.probe_options import AttentionEntropyOptions
from flowrl.core.choices import one_of
from flowrl.core.interfaces import AttentionEntropyProbe
from flowrl.parts.entropy import jump_std, merged_entropy
from flowrl.parts.selectors import merged_if
from flowrl_zoo.aegpo.probe import entropy_curves

Mode = Literal["topk", "peaks"]
UnitRule = Literal["single", "egrpo"]
PROBE_INFO = "aegpo/probe"  # plan.info key: the per-prompt curves, shared with aegpo_allocate


def ranked_steps(curve: list[float], candidates: list[int], mode: str, fill: bool) -> list[int]:
    """Candidate steps in the order they are taken: by entropy (``topk``), or local maxima first (``peaks``).

    A peak is a step whose entropy is at least its neighbours' and above one of them (an end step has one
    neighbour). With ``fill`` the remaining candidates follow, by entropy, so K can always be met.
    """
    by_entropy = sorted(candidates, key=lambda i: (-curve[i], i))
    if mode == "topk":
        return by_entropy
    n = len(curve)

    def is_peak(i: int) -> bool:
        neighbours = [curve[j] for j in (i - 1, i + 1) if 0 <= j < n]
        return all(curve[i] >= c for c in neighbours) and any(curve[i] > c for c in neighbours)

    peaks = [i for i in by_entropy if is_peak(i)] or by_entropy[:1]
    return peaks + [i for i in by_entropy if i not in peaks] if fill else peaks


def egrpo_merge(schedule: Schedule, start: int, tau: float, max_merge: int) -> int:
    """E-GRPO's rule from ``start``: the smallest merge whose jump entropy reaches ``tau``; if none does,
    the merge with the largest entropy (the closest to ``tau``)."""
    merges = range(1, min(max_merge, schedule.num_steps - start) + 1)
    values = {m: merged_entropy(schedule, start, m) for m in merges}
    reaching = [m for m in merges if values[m] >= tau]
    return reaching[0] if reaching else max(merges, key=lambda m: (values[m], -m))


@register("selector", "aegpo_topk")
class AttentionEntropyTopK(TimestepSelector):
    """SDE steps at the top-K (or peak) steps of the attention entropy Entropy(t) (AEGPO, arXiv 2602.06825).

    Local adaptive exploration: ``observe`` runs one deterministic ODE trajectory per prompt with the
    current policy, probing the attention entropy at every step (N probed forwards per prompt, counted in
    ``backbone.nfe``), and averages the curves over the prompts. ``plan`` takes the K highest steps as
    units (``single``: merge 1; ``egrpo``: E-GRPO's merged jump from each chosen step), all trained,
    non-overlapping.
    """

    needs_backbone = (AttentionEntropyProbe,)  # it probes attention entropy

    @attrs.frozen
    class Config:
        k: int = attrs.field(default=4, validator=ge(1))  # exploration steps (units) per iteration
        mode: Mode = attrs.field(default="topk", validator=one_of(Mode))
        unit_rule: UnitRule = attrs.field(default="single", validator=one_of(UnitRule))
        tau: float = 1.0  # egrpo rule: nats per dimension a merged jump must reach
        max_merge: int = attrs.field(default=8, validator=ge(1))  # egrpo rule: longest merge considered
        fill: bool = True  # replace overlapping units / missing peaks by the next-ranked steps (K units always)
        exclude_last: bool = True  # never explore the final step (to s = 0), as DanceGRPO drops it
        probe_every: int = attrs.field(default=1, validator=ge(1))  # re-probe every n iterations (reuse between)
        probe_seed: int = attrs.field(default=0, validator=ge(0))  # the fixed per-prompt probe noise
        attention: AttentionEntropyOptions = attrs.field(factory=AttentionEntropyOptions)

    @staticmethod
    def provides(config: Config) -> frozenset[str]:
        """Merged units with E-GRPO's rule (``unit_rule = "egrpo"``) when a merge is allowed."""
        return merged_if(config.unit_rule == "egrpo" and config.max_merge > 1)

    @staticmethod
    def check_steps(config: Config, num_steps: int) -> list[tuple[str, str]]:
        candidates = num_steps - int(config.exclude_last)
        if config.k > candidates:
            return [("k", f"k = {config.k} exploration steps but only {candidates} candidate steps of {num_steps}")]
        return []

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.calls = 0
        self.curve: list[float] | None = None  # Entropy(t), mean over the last probed prompts
        self.shared: dict[str, Any] | None = None  # this iteration's per-prompt curves (for the allocator)
        self.probe_nfe = 0

    def observe(self, backbone: Backbone, prompts: list[str], schedule: Schedule) -> None:
        c = self.config
        self.calls += 1
        self.shared, self.probe_nfe = None, 0
        if self.curve is not None and len(self.curve) == schedule.num_steps and (self.calls - 1) % c.probe_every:
            return
        nfe0 = backbone.nfe
        steps = list(range(schedule.num_steps))
        rows = entropy_curves(backbone, prompts, schedule, c.attention, steps, c.probe_seed)
        self.probe_nfe = backbone.nfe - nfe0
        self.curve = [float(v) for v in rows.mean(0)]
        self.shared = {
            "prompts": list(prompts),
            "sigmas": tuple(schedule.sigmas),
            "options": c.attention,
            "seed": c.probe_seed,
            "steps": steps,
            "rows": rows,
        }

    def plan(self, schedule: Schedule, iteration: int, generator: torch.Generator) -> Plan:
        c, n = self.config, schedule.num_steps
        candidates = [i for i in range(n - int(c.exclude_last)) if jump_std(schedule, i, 1) > 0]
        curve = self.curve if self.curve is not None and len(self.curve) == n else None
        info: dict[str, Any] = {"aegpo/probe_nfe": self.probe_nfe}
        if curve is None:  # not observed yet (e.g. `flowrl entropy`): evenly spread steps
            pick = sorted({candidates[round(j * (len(candidates) - 1) / max(c.k - 1, 1))] for j in range(c.k)})
            ranked, info["aegpo/fallback"] = pick, True
        else:
            ranked = ranked_steps(curve, candidates, c.mode, c.fill)
            info["aegpo/entropy_curve"] = list(curve)
        chosen = ranked if c.fill else ranked[: c.k]
        taken: list[tuple[int, int]] = []
        for start in chosen:
            if len(taken) == c.k:
                break
            merge = 1 if c.unit_rule == "single" else egrpo_merge(schedule, start, c.tau, c.max_merge)
            if all(start + merge <= a or start >= a + m for a, m in taken):
                taken.append((start, merge))
        if not taken:
            raise ValueError("aegpo_topk: no exploration step left (check k, exclude_last and the kernel's noise)")
        units = tuple(Unit(a, m) for a, m in sorted(taken))
        info["aegpo/steps"] = [u.start for u in units]
        if self.shared is not None:
            info[PROBE_INFO] = self.shared
        return Plan(units=units, trained=tuple(range(len(units))), info=info)

    def state_dict(self) -> dict[str, Any]:
        return {"calls": self.calls, "curve": self.curve}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.calls = int(state.get("calls", 0))
        curve = state.get("curve")
        self.curve = [float(v) for v in curve] if curve is not None else None
