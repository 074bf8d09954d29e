"""trainer.overlap_chunks reads what a sampler declares (``RolloutSampler.chunkable``, ``precomputed_scores``),
never its class: every shipped sampler declares what the class tests decided before, a user's sampler gets the
overlap path or the plain one by its declaration alone, and the loop and the overlap module test no sampler's
class."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import torch
from conftest import tiny_recipe
from torch import Tensor

import flowrl
from flowrl.config.recipe import recipe_from_dict
from flowrl.core.interfaces import Backbone, RolloutSampler
from flowrl.core.registry import registry
from flowrl.core.rng import RolloutRNG
from flowrl.core.types import Plan, Rollout, Schedule
from flowrl.parts.samplers.independent import IndependentSampler
from flowrl.rewards.built import BuiltReward
from flowrl.trainer import Trainer, train
from flowrl.trainer.overlap import OverlappedSampler, chunkable, overlapped

MODULE = Path(__file__).stem  # tests/ is on sys.path: a recipe names these classes as f"{MODULE}:Class"
ROOT = Path(__file__).resolve().parents[1]

# What the class tests decided before the declaration (``type(sampler) is IndependentSampler``, no shipped
# sampler declaring ``chunkable``): only ``independent`` was rolled out in chunks.
BEFORE = {
    "independent": True,
    "anchor_branch": False,
    "tempflow_branch": False,
    "egrpo_granular": False,
    "mix_grpo_flash": False,
    "branch_tree": False,
    "aegpo_allocate": False,
    "iso_temporal": True,  # added later, declared: each prompt draws its step and noise from its own stream
    "preference_file": False,
}


class UserIndependent(IndependentSampler):
    """A user's subclass of ``independent`` that says nothing: it inherits ``chunkable``."""


class UserWhole(IndependentSampler):
    """A user's subclass that declares its prompts must be rolled out together."""

    chunkable = False


class UserWrapper(RolloutSampler):
    """A user's wrapper (no subclass of any shipped sampler) around ``independent``, declaring it chunkable."""

    Config = IndependentSampler.Config
    chunkable = True

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.inner = IndependentSampler(config)

    def rollout(self, backbone: Backbone, prompts: list[str], plan: Plan, schedule: Schedule,
                rng: RolloutRNG) -> Rollout:
        return self.inner.rollout(backbone, prompts, plan, schedule, rng)


class UserScored(IndependentSampler):
    """A user's sampler that declares scores it computed itself: the reward phase takes them."""

    chunkable = False

    def precomputed_scores(self, reward: str, images: Tensor) -> Tensor | None:
        return torch.full((images.shape[0],), 0.25)


def rewards() -> list[BuiltReward]:
    return [BuiltReward("r", 1.0, flowrl.build("reward", {"type": "jpeg_compressibility"}))]


def test_every_shipped_sampler_declares_what_the_class_tests_decided() -> None:
    shipped = {name: cls for name, cls in registry("sampler").items()
               if cls.__module__.split(".")[0] in ("flowrl", "flowrl_zoo")}
    assert {name: cls.chunkable for name, cls in shipped.items()} == BEFORE
    assert RolloutSampler.chunkable is False  # the default a new sampler gets
    for name, spec in (("independent", {}), ("mix_grpo_flash", {}), ("anchor_branch", {"group_size": 4})):
        sampler = flowrl.build("sampler", {"type": name, **spec})
        wrapped = overlapped(sampler, rewards(), 3)
        assert chunkable(sampler) is BEFORE[name] and isinstance(wrapped, OverlappedSampler) is BEFORE[name], name
        assert sampler.precomputed_scores("r", torch.zeros(2, 3, 4, 4)) is None  # the loop scores them itself


def test_a_user_sampler_gets_overlap_by_its_declaration_alone() -> None:
    config = IndependentSampler.Config(group_size=2)
    for cls, chunked in ((UserIndependent, True), (UserWrapper, True), (UserWhole, False)):
        sampler = cls(config)
        wrapped = overlapped(sampler, rewards(), 2)
        assert chunkable(sampler) is chunked, cls.__name__
        assert (isinstance(wrapped, OverlappedSampler) and wrapped.inner is sampler) if chunked else wrapped is sampler


def test_the_trainer_wraps_a_recipe_named_user_sampler_by_its_declaration(tmp_path: Path) -> None:
    for cls, chunked in ((UserIndependent, True), (UserWhole, False)):
        data = tiny_recipe(max_steps=1, eval_every=0, overlap_chunks=2)
        data["sampler"] = {"type": f"{MODULE}:{cls.__name__}", "group_size": 2}
        trainer = Trainer(recipe_from_dict(data), tmp_path / cls.__name__, quiet=True)
        try:
            assert isinstance(trainer.sampler, OverlappedSampler) is chunked, cls.__name__
            inner = trainer.sampler.inner if chunked else trainer.sampler  # type: ignore[attr-defined]
            assert type(inner) is cls
        finally:
            trainer.release()


def test_the_reward_phase_takes_the_scores_a_sampler_declares(tmp_path: Path) -> None:
    data = tiny_recipe(max_steps=1, eval_every=0)
    data["sampler"] = {"type": f"{MODULE}:UserScored", "group_size": 2}
    run = train(recipe_from_dict(data), tmp_path / "run", quiet=True)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [row["reward/total"] for row in rows] == [0.25]  # JPEG compressibility never gives exactly 0.25


def sampler_class_tests(path: Path) -> list[str]:
    """Each isinstance/issubclass against a ``...Sampler`` class, each ``type(x) is/==`` test, and each import
    of a shipped sampler class in ``path``, as ``line: source``."""
    source = path.read_text()
    found = []

    def names(node: ast.AST) -> list[str]:
        return [n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node)
                if isinstance(n, ast.Name | ast.Attribute)]

    for node in ast.walk(ast.parse(source)):
        bad = False
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("isinstance",
                                                                                                 "issubclass"):
            bad = len(node.args) == 2 and any(n.endswith("Sampler") for n in names(node.args[1]))
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            bad = any(isinstance(s, ast.Call) and isinstance(s.func, ast.Name) and s.func.id == "type" for s in sides)
        elif isinstance(node, ast.ImportFrom):
            bad = (node.module or "").startswith(("flowrl.parts.samplers", "flowrl_zoo"))
        if bad:
            found.append(f"{node.lineno}: {ast.get_source_segment(source, node)}")
    return found


def test_the_loop_and_the_overlap_module_test_no_sampler_class() -> None:
    for name in ("loop.py", "overlap.py"):
        assert sampler_class_tests(ROOT / "flowrl" / "trainer" / name) == [], name
