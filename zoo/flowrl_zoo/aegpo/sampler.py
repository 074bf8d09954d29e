"""AEGPO's global allocation as a sampler wrapper: more rollouts for prompts whose attention moved most."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import attrs
from attrs.validators import ge, gt, optional

from flowrl import Backbone, Plan, Rollout, RolloutSampler, Schedule, build, register, registry
from flowrl.backbones.common.probe_options import AttentionEntropyOptions
from flowrl.core.choices import one_of
from flowrl.core.contracts import Need, provided, required
from flowrl.core.convert import ConfigError, structure, unstructure
from flowrl.core.interfaces import AttentionEntropyProbe
from flowrl.core.registry import RegistryError
from flowrl.core.rng import RolloutRNG
from flowrl_zoo.aegpo.allocation import delta_entropy, group_sizes
from flowrl_zoo.aegpo.probe import entropy_curves
from flowrl_zoo.aegpo.selector import PROBE_INFO

Allocation = Literal["proportional", "softmax", "tiers"]


def host_table(value: Any) -> dict[str, Any]:
    """Validate the host sampler's table and fill in its defaults: ``{"type": ..., **config}``."""
    if not isinstance(value, Mapping):
        raise ValueError(f"expected a table like {{ type = 'independent', group_size = 8 }}, got {value!r}")
    spec = dict(value)
    name = spec.pop("type", None)
    if not isinstance(name, str):
        raise ValueError("missing 'type' (a sampler name, e.g. 'independent'; flowrl ls sampler)")
    if name == "aegpo_allocate":
        raise ValueError("aegpo_allocate cannot wrap itself")
    stale = [key for key in ("num_steps", "shift") if key in spec]
    if stale:  # recipes before [schedule] set them in the host's table
        raise ValueError(f"{' and '.join(stale)} belong in the recipe's [schedule] table, not in the host's")
    try:
        _, config = host_part({"type": name, **spec})
    except RegistryError as error:
        raise ValueError(str(error)) from None
    except ConfigError as error:
        raise ValueError("; ".join(f"{path}: {msg}" for path, msg in error.problems)) from None
    if not hasattr(config, "group_size"):
        raise ValueError(f"sampler '{name}' has no 'group_size'; AEGPO needs a host with a group size")
    return {"type": name, **unstructure(config)}


def host_part(host: Mapping[str, Any]) -> tuple[Any, Any]:
    """The host sampler's registered class and its validated config, from a host table ``{"type": ..., ...}``."""
    cls: Any = registry("sampler").get(host["type"])
    return cls, structure(cls.Config, {k: v for k, v in host.items() if k != "type"}, "host")


def check_host(_instance: object, _attribute: object, value: Any) -> None:
    """The host table as a validator, so that its problems are listed with the recipe's others."""
    host_table(value)


@register("sampler", "aegpo_allocate")
class EntropyAllocation(RolloutSampler):
    """Splits the rollout budget G x prompts by ΔEntropy, then runs a host sampler (AEGPO, arXiv 2602.06825).

    Global adaptive allocation: per prompt, ``ΔEntropy = mean over probe steps of |H_current - H_base| /
    H_base`` along one ODE trajectory from a fixed per-prompt noise. ``H_base`` (the base policy, under
    ``backbone.reference_policy()``) is cached per prompt text and saved in checkpoints; ``H_current`` is
    reused from the ``aegpo_topk`` selector's probe when it measured the same thing, else probed here.
    The host gets ``plan.group_sizes``; its loss, kernel and estimator are unchanged.
    """

    needs_backbone = (AttentionEntropyProbe,)  # it probes attention entropy

    needs_reference = True  # the trainer installs a reference policy (LoRA off, or a frozen copy)

    @attrs.frozen
    class Config:
        host: dict[str, Any] = attrs.field(
            factory=lambda: {"type": "independent"}, converter=host_table, validator=check_host
        )
        allocation: Allocation = attrs.field(default="proportional", validator=one_of(Allocation))
        temperature: float = attrs.field(default=1.0, validator=gt(0))  # softmax over ΔEntropy / its batch mean
        tiers: int = attrs.field(default=3, validator=ge(1))  # bands of the tiers allocation
        min_group: int = attrs.field(default=2, validator=ge(2))  # fewest rollouts a prompt gets
        max_group: int | None = attrs.field(default=None, validator=optional(ge(2)))  # most (None: 2 G)
        delta_steps: tuple[int, ...] = attrs.field(default=(), converter=tuple)  # steps averaged (): all
        probe_seed: int = attrs.field(default=0, validator=ge(0))  # the fixed per-prompt probe noise
        attention: AttentionEntropyOptions = attrs.field(factory=AttentionEntropyOptions)

        def __attrs_post_init__(self) -> None:
            g = self.group_size
            if not self.min_group <= g <= self.upper:
                raise ValueError(
                    f"need min_group <= host group_size <= max_group, got {self.min_group}, {g}, {self.upper}"
                )

        @property
        def group_size(self) -> int:
            """The host's G: the mean rollouts per prompt (the budget is G x prompts)."""
            return int(self.host["group_size"])

        @property
        def upper(self) -> int:
            return self.max_group if self.max_group is not None else 2 * self.group_size

    @staticmethod
    def provides(config: Config) -> frozenset[str]:
        """The host's: the rollouts are the host sampler's."""
        host, host_config = host_part(config.host)
        return provided(host, host_config)

    @staticmethod
    def requires(config: Config) -> tuple[Need, ...]:
        """The host's conditions on the other parts (a branching host needs trained units, ...)."""
        host, host_config = host_part(config.host)
        return required(host, host_config)

    @staticmethod
    def check_steps(config: Config, num_steps: int) -> list[tuple[str, str]]:
        bad = [k for k in config.delta_steps if not 0 <= k < num_steps]
        if bad:
            return [("delta_steps", f"steps {bad} are outside the schedule's steps 0..{num_steps - 1}")]
        host, host_config = host_part(config.host)
        return [(f"host.{key}", message) for key, message in host.check_steps(host_config, num_steps)]

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.host: RolloutSampler = build("sampler", config.host)
        self.base: dict[str, list[float]] = {}  # H_base per prompt text, at the probe steps
        self.signature = ""  # what the cached values measured; a change empties the cache

    def rollout_count(self, plan: Plan, num_prompts: int) -> int:
        """The host's count: the allocation moves rollouts between prompts, its sizes sum to ``G`` x prompts."""
        return self.host.rollout_count(attrs.evolve(plan, group_sizes=None), num_prompts)

    def rollout(
        self, backbone: Backbone, prompts: list[str], plan: Plan, schedule: Schedule, rng: RolloutRNG
    ) -> Rollout:
        c = self.config
        nfe0 = backbone.nfe
        steps = list(c.delta_steps) or list(range(schedule.num_steps))
        signature = repr((unstructure(c.attention), c.probe_seed, steps, [round(s, 8) for s in schedule.sigmas]))
        if signature != self.signature:
            self.base, self.signature = {}, signature
        missing = [p for p in dict.fromkeys(prompts) if p not in self.base]
        if missing:
            with backbone.reference_policy():
                rows = entropy_curves(backbone, missing, schedule, c.attention, steps, c.probe_seed)
            self.base.update({p: [float(v) for v in row] for p, row in zip(missing, rows, strict=True)})
        current = self._current(backbone, prompts, schedule, steps, plan.info.get(PROBE_INFO))
        delta = delta_entropy(current, [self.base[p] for p in prompts])
        sizes = group_sizes(
            delta, c.group_size * len(prompts), c.min_group, c.upper, c.allocation, c.temperature, c.tiers
        )
        info = {k: v for k, v in plan.info.items() if k != PROBE_INFO}
        info.update({"aegpo/delta_entropy": delta, "aegpo/group_sizes": sizes})
        rollout = self.host.rollout(
            backbone, prompts, attrs.evolve(plan, group_sizes=tuple(sizes), info=info), schedule, rng
        )
        rollout.nfe = backbone.nfe - nfe0  # probes here and the host's rollout (the loop also counts observe())
        return rollout

    def _current(
        self, backbone: Backbone, prompts: list[str], schedule: Schedule, steps: list[int], shared: Any
    ) -> list[list[float]]:
        """H_current per prompt: the selector's probe of this iteration when it matches, else a new probe."""
        c = self.config
        if (
            isinstance(shared, dict)
            and shared.get("prompts") == list(prompts)
            and shared.get("sigmas") == tuple(schedule.sigmas)
            and shared.get("options") == c.attention
            and shared.get("seed") == c.probe_seed
            and set(steps) <= set(shared.get("steps", ()))
        ):
            columns = [shared["steps"].index(k) for k in steps]
            return [[float(v) for v in row] for row in shared["rows"][:, columns]]
        rows = entropy_curves(backbone, prompts, schedule, c.attention, steps, c.probe_seed)
        return [[float(v) for v in row] for row in rows]

    def state_dict(self) -> dict[str, Any]:
        return {"signature": self.signature, "base": {p: list(v) for p, v in self.base.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.signature = str(state.get("signature", ""))
        # a Prompt keeps its condition images (str() would keep the text alone, and a resumed edit run re-probed)
        saved = dict(state.get("base", {}))
        self.base = {p if isinstance(p, str) else str(p): [float(x) for x in v] for p, v in saved.items()}
