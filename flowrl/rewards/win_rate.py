"""``[[reward]] type = "pairwise_win_rate"``: each image's win rate within its group, from a pairwise judge
(Pref-GRPO, arXiv 2508.20751).

Every unordered pair ``{i, j}`` of a group of ``G`` images goes to the judge named by the ``[reward.judge]`` table
(``flowrl ls judge``) once, ``i`` before ``j`` for ``i < j``; its verdict ``p_ij`` in [0, 1] is ``i``'s share of
the win (1 a win, 0 a loss, 0.5 a tie or an answer the judge could not give), and ``j`` gets ``1 - p_ij``. Image
``i``'s score is ``w_i = sum_{j != i} p_ij / (G - 1)``: (wins + ties / 2) / (G - 1) for a judge of whole verdicts.
The ``G (G - 1) / 2`` pairs share out ``G (G - 1) / 2`` points, so ``sum_i w_i = G / 2`` and a group's mean score
is always 1/2: the reward says how the images rank among themselves, not how good the group is, and
``reward/<name>`` stays at 0.5 (a run's progress shows in its other rewards and its evaluation).

``both_orders = true`` asks every pair twice, ``(i, j)`` and ``(j, i)``, and takes ``p_ij = (p(i, j) + 1 -
p(j, i)) / 2``, which cancels a judge's preference for the first (or second) position, for twice the judge calls.
Off by default, as in the paper's release (one fixed order per pair): the bias it leaves depends only on the
images' places in the group, and the rollouts of a group are exchangeable (independent noise), so it adds
variance to the advantages but no preference for any content; turn it on when the judge calls are cheap next to
the rollout, or for a judge known to favour a position.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs
import torch
from torch import Tensor

from flowrl.core.convert import ConfigError, structure, unstructure
from flowrl.core.group_rewards import GroupReward
from flowrl.core.judges import PairwiseJudge
from flowrl.core.registry import RegistryError, register, registry


def judge_part(table: Mapping[str, Any]) -> tuple[Any, Any]:
    """The judge's registered class and its validated config, from a table ``{"type": ..., ...}``."""
    cls: Any = registry("judge").get(str(table["type"]))
    return cls, structure(cls.Config, {k: v for k, v in table.items() if k != "type"}, "judge")


def judge_table(value: Any) -> dict[str, Any]:
    """Validate a ``[reward.judge]`` table and fill in its defaults: ``{"type": ..., **config}``."""
    if not isinstance(value, Mapping):
        raise ValueError(f"expected a table like {{ type = 'world_verifier' }} (flowrl ls judge), got {value!r}")
    if not isinstance(value.get("type"), str):
        raise ValueError("missing 'type' (a pairwise judge, e.g. 'world_verifier'; flowrl ls judge)")
    try:
        _, config = judge_part(value)
    except RegistryError as error:
        raise ValueError(str(error)) from None
    except ConfigError as error:
        raise ValueError("; ".join(f"{path}: {message}" for path, message in error.problems)) from None
    return {"type": value["type"], **unstructure(config)}


def check_judge(_instance: object, _attribute: object, value: Any) -> None:
    # the judge table as a validator, so that its problems are listed with the recipe's others
    judge_table(value)


def pairs(size: int) -> tuple[Tensor, Tensor]:
    """Every unordered pair of ``size`` items once, as index tensors ``(i, j)`` with ``i < j``."""
    index = torch.triu_indices(size, size, offset=1)
    return index[0], index[1]


def win_rates(first: Tensor, second: Tensor, verdicts: Tensor, size: int) -> Tensor:
    """``w_i = sum_j p_ij / (size - 1)`` in float64: pair ``k`` gives ``verdicts[k]`` to ``first[k]`` and the rest
    of its point to ``second[k]``. A group of one scores 0.5 (nothing to compare with; a tie with itself)."""
    if size < 2:
        return torch.full((size,), 0.5, dtype=torch.float64)
    p = verdicts.double()
    wins = torch.zeros(size, dtype=torch.float64).index_add_(0, first, p).index_add_(0, second, 1.0 - p)
    return wins / (size - 1)


@register("reward", "pairwise_win_rate")
class PairwiseWinRate(GroupReward):
    """Each image's win rate within its group by a pairwise judge, ``(wins + ties / 2) / (G - 1)`` (Pref-GRPO).

    A group-wise reward: the trainer hands it each group's images at once. ``[reward.judge]`` names the judge and
    its settings; ``both_orders`` asks each pair in both orders to cancel a position bias (twice the calls).
    """

    @attrs.frozen
    class Config:
        # [reward.judge]: the judge and its settings; by default the paper's, a VLM served behind an OpenAI-style API
        # (whose url a recipe must then set)
        judge: dict[str, Any] = attrs.field(factory=lambda: {"type": "openai"}, converter=judge_table,
                                            validator=check_judge)
        both_orders: bool = False  # ask (i, j) and (j, i) and average: no position bias, twice the judge calls

    @staticmethod
    def check_config(config: Config) -> Iterable[tuple[str, str]]:
        cls, judge_config = judge_part(config.judge)
        return [(f"judge.{key}" if key else "judge", message) for key, message in cls.check_config(judge_config)]

    @classmethod
    def needs_conditions(cls, config: Config) -> bool:
        judge, judge_config = judge_part(config.judge)
        return bool(judge.needs_conditions(judge_config))

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        cls, judge_config = judge_part(config.judge)
        self.judge: PairwiseJudge = cls(judge_config)

    def check(self) -> None:
        self.judge.check()

    def state_dict(self) -> dict[str, Any]:
        return {"judge": self.judge.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.judge.load_state_dict(state.get("judge", {}))

    def verdicts(self, first: Tensor, second: Tensor, prompts: list[str]) -> Tensor:
        """The judge's verdicts on the pairs, checked: ``(K,)`` finite numbers in [0, 1]."""
        found = self.judge.compare(first, second, prompts)
        name = f"judge '{self.judge.registered_name or type(self.judge).__name__}'"
        if not isinstance(found, Tensor) or tuple(found.shape) != (len(prompts),):
            shape = tuple(found.shape) if isinstance(found, Tensor) else type(found).__name__
            raise ValueError(f"{name} returned {shape} for {len(prompts)} pairs; compare() gives one verdict per pair")
        found = found.detach().double().cpu()
        if not bool(((found >= 0) & (found <= 1)).all()):  # NaN fails too
            raise ValueError(f"{name} returned verdicts outside [0, 1]: {found.tolist()[:8]}")
        return found

    def score_group(self, images: Tensor, prompt: str) -> Tensor:
        size = images.shape[0]
        first, second = pairs(size)
        prompts = [prompt] * len(first)
        if not prompts:
            return win_rates(first, second, torch.zeros(0), size).float()
        p = self.verdicts(images[first], images[second], prompts)
        if self.config.both_orders:
            p = (p + 1.0 - self.verdicts(images[second], images[first], prompts)) / 2
        return win_rates(first, second, p, size).float()
