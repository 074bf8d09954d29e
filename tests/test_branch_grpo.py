"""BranchGRPO: tree sampler cost and structure, depth-wise advantages, node-indexed training, the recipe."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
from conftest import ROOT, tiny_recipe
from flowrl_zoo.branch_grpo import analytic_nfe, depthwise_normalize, node_rewards, width_prune
from flowrl_zoo.branch_grpo.tree import Tree
from hypothesis import given, settings
from hypothesis import strategies as st

import flowrl
from flowrl.cli.main import main as flowrl_main
from flowrl.config.recipe import RecipeError, recipe_from_dict
from flowrl.core.rng import RolloutRNG
from flowrl.core.types import Advantages, LossInputs, Plan, RewardBatch, Rollout, Schedule, Unit, transition_advantages
from flowrl.trainer import Trainer
from flowrl.trainer.advantage import global_advantages
from flowrl.trainer.micro_batches import transition_losses

TINY = {"type": "tiny_flux", "resolution": 16, "num_layers": 1, "num_single_layers": 1}


def sample(
    splits: list[int], num_steps: int, factor: int = 2, prompts: int = 1, backbone: Any = None, **sampler: Any
) -> tuple[Rollout, Any, Schedule]:
    backbone = backbone or flowrl.build("backbone", TINY)
    cfg = {"type": "branch_tree", "factor": factor, **sampler}
    tree_sampler = flowrl.build("sampler", cfg)
    schedule = Schedule(backbone.schedule_sigmas(num_steps, 3.0), flowrl.build("kernel", {"type": "flow_grpo_sde"}))
    plan = flowrl.build("selector", {"type": "branch_splits", "splits": splits}).plan(schedule, 0, torch.Generator())
    names = [f"prompt {k}" for k in range(prompts)]
    with torch.no_grad():
        rollout = tree_sampler.rollout(backbone, names, plan, schedule, RolloutRNG(0, 0, range(prompts)))
    return rollout, backbone, schedule


def by_hand_nfe(splits: list[int], num_steps: int, factor: int) -> int:
    """Distinct latents at each step: factor ** (splits strictly before the step)."""
    return sum(factor ** sum(1 for s in splits if s < t) for t in range(num_steps))


def test_paper_tree_costs_203_evaluations_in_one_call_per_step() -> None:
    backbone = flowrl.build("backbone", {"type": "tiny_flux", "resolution": 16})
    calls = {"n": 0}
    velocity = backbone.velocity

    def counting(*args: Any) -> torch.Tensor:
        calls["n"] += 1
        return velocity(*args)

    backbone.velocity = counting
    rollout, _, _ = sample([0, 3, 6, 9], 20, backbone=backbone)
    assert backbone.nfe == rollout.nfe == 203 == analytic_nfe(20, [(0, 1), (3, 1), (6, 1), (9, 1)], 2)
    assert rollout.num_rollouts == 16 and calls["n"] == 20  # level by level: one batched call per step


@pytest.mark.parametrize(
    ("splits", "steps", "factor", "prompts"),
    [([0], 5, 3, 1), ([1, 2], 5, 2, 2), ([0, 2, 3], 6, 2, 1), ([4], 5, 2, 3)],
)
def test_nfe_formula(splits: list[int], steps: int, factor: int, prompts: int) -> None:
    rollout, _, _ = sample(splits, steps, factor, prompts)
    expected = by_hand_nfe(splits, steps, factor)
    assert analytic_nfe(steps, [(s, 1) for s in splits], factor) == expected
    assert rollout.nfe == prompts * expected
    assert rollout.num_rollouts == prompts * factor ** len(splits)


def test_merged_split_formula() -> None:
    # A split (1, 2) jumps from step 1 to 3: step 2 is never evaluated. Widths: 1, 1, -, 2, 2 -> 6.
    assert analytic_nfe(5, [(1, 2)], 2) == 6


def test_tree_structure_and_shared_inputs() -> None:
    rollout, _, _ = sample([0, 2], 4, factor=2, prompts=2)
    tree, t = rollout.extras["tree"], rollout.transitions
    assert isinstance(tree, Tree) and t.node_index is not None
    # 2 roots, 4 depth-1 nodes, 8 leaves; leaves are the rollouts.
    assert tree.depth.tolist() == [0] * 2 + [1] * 4 + [2] * 8
    assert torch.equal(tree.leaf, torch.arange(6, 14)) and torch.equal(tree.tree[tree.leaf], rollout.rollout_prompt)
    # One stored input per parent, shared by its children; an edge lands on its child node.
    assert t.num_inputs == 2 + 4 and len(t) == 4 + 8
    parents = tree.parent[t.node_index]
    assert torch.equal(parents, torch.tensor([0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]))
    assert torch.equal(t.input_index, torch.arange(6).repeat_interleave(2))
    assert torch.equal(tree.log_prob[t.node_index], t.log_prob)
    # rollout_index is a leaf below the child.
    for edge in range(len(t)):
        node = int(tree.leaf[t.rollout_index[edge]])
        while node >= 0 and node != int(t.node_index[edge]):
            node = int(tree.parent[node])
        assert node == int(t.node_index[edge])
    # Siblings differ (independent noise).
    assert (t.x_next[0] - t.x_next[1]).abs().max() > 1e-4


def test_depth_pruning_records_no_edges_of_pruned_depths() -> None:
    schedule = Schedule(tuple(1 - k / 6 for k in range(7)), None)
    plan = flowrl.build("selector", {"type": "branch_splits", "splits": [0, 2, 4], "prune_depths": [1, 3]}).plan(
        schedule, 0, torch.Generator()
    )
    assert plan.trained == (1,)
    with pytest.raises(ValueError, match="out of range"):
        flowrl.build("selector", {"type": "branch_splits", "splits": [0, 2], "prune_depths": [3]})


def test_exploration_temperature_scales_noise_not_density() -> None:
    kernel = flowrl.build("kernel", {"type": "flow_grpo_sde"})
    base, backbone, schedule = sample([0], 3, 2)
    hot, _, _ = sample([0], 3, 2, backbone=backbone, exploration_temperature=3.0)
    x, s = base.transitions.inputs, base.transitions.input_s
    with torch.no_grad():
        v = backbone.velocity(x, s, base.cond.take(torch.zeros(1, dtype=torch.long)))
    mean, std = kernel.mean_std(x[[0, 0]], v[[0, 0]], s[[0, 0]], base.transitions.s_next, schedule.s_at_one)
    # v is the sampler's own one-row forward at the root (same shapes: the same mean); what is left is the float32
    # rounding of x_next (|x| < 7, ulp 4.8e-7, tripled by the scaling): ~1e-6, 10x under atol 1e-5
    torch.testing.assert_close(hot.transitions.x_next - mean, 3.0 * (base.transitions.x_next - mean), atol=1e-5, rtol=0)
    recorded = flowrl.core.interfaces.gaussian_log_prob(hot.transitions.x_next, mean, std)
    torch.testing.assert_close(hot.transitions.log_prob, recorded, atol=1e-5, rtol=0)


@st.composite
def random_trees(draw: Any) -> tuple[Tree, torch.Tensor]:
    """Trees level by level: each node has 1-3 children; leaves all at the last depth; rewards on a grid."""
    prompts, levels = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    parent, depth, tree = [-1] * prompts, [0] * prompts, list(range(prompts))
    current = list(range(prompts))
    for level in range(1, levels + 1):
        nxt = []
        for node in current:
            for _ in range(draw(st.integers(1, 3))):
                nxt.append(len(parent))
                parent.append(node)
                depth.append(level)
                tree.append(tree[node])
        current = nxt
    lp = draw(st.lists(st.floats(-3, 3), min_size=len(parent), max_size=len(parent)))
    rewards = torch.tensor(draw(st.lists(st.integers(-8, 8), min_size=len(current), max_size=len(current)))) / 4
    t = Tree(torch.tensor(parent), torch.tensor(depth), torch.tensor(tree), torch.tensor(lp), torch.tensor(current))
    return t, rewards


@settings(max_examples=60, deadline=None)
@given(random_trees(), st.sampled_from(["leaf_mean", "logprob_softmax"]))
def test_depthwise_advantages_have_zero_mean_per_depth(case: tuple[Tree, torch.Tensor], mode: str) -> None:
    tree, rewards = case
    values = node_rewards(tree, rewards, mode)
    adv = depthwise_normalize(tree, values, eps=1e-4, clip=None)
    for k in tree.tree.unique():
        for d in tree.depth.unique():
            members = (tree.tree == k) & (tree.depth == d)
            if int(members.sum()) == 1:
                assert float(adv[members]) == 0.0  # a single-node depth (a root) gets 0
            else:
                assert abs(float(adv[members].mean())) < 1e-9
    # Inner node rewards lie within their children's range; leaf_mean roots are the mean of their leaves.
    inner = tree.parent[tree.parent >= 0].unique()
    for node in inner.tolist():
        kids = values[tree.parent == node]
        assert float(kids.min()) - 1e-9 <= float(values[node]) <= float(kids.max()) + 1e-9
    if mode == "leaf_mean":
        for root in (tree.parent == -1).nonzero().flatten().tolist():
            assert abs(float(values[root]) - float(rewards[tree.tree[tree.leaf] == root].double().mean())) < 1e-9


def small_tree() -> Tree:
    """One prompt; root 0 -> nodes 1, 2 -> leaves 3, 4 (under 1) and 5, 6 (under 2)."""
    return Tree(
        parent=torch.tensor([-1, 0, 0, 1, 1, 2, 2]),
        depth=torch.tensor([0, 1, 1, 2, 2, 2, 2]),
        tree=torch.zeros(7, dtype=torch.long),
        log_prob=torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0]),
        leaf=torch.tensor([3, 4, 5, 6]),
    )


def test_node_rewards_by_hand() -> None:
    rewards = torch.tensor([1.0, 3.0, 0.0, 4.0])
    mean = node_rewards(small_tree(), rewards, "leaf_mean")
    assert mean.tolist() == [2.0, 2.0, 2.0, 1.0, 3.0, 0.0, 4.0]
    soft = node_rewards(small_tree(), rewards, "logprob_softmax")
    w = torch.softmax(torch.tensor([0.0, 2.0], dtype=torch.float64), 0)
    assert soft[2] == pytest.approx(float(w[1] * 4)) and soft[1] == pytest.approx(2.0)
    assert soft[0] == pytest.approx(float((2.0 + soft[2]) / 2))
    # Depth 1 nodes tie under leaf_mean: a constant depth gives zeros; the root is a single node.
    adv = depthwise_normalize(small_tree(), mean, eps=0.0)
    leaves = (torch.tensor([1.0, 3.0, 0.0, 4.0], dtype=torch.float64) - 2.0) / 2.5**0.5
    torch.testing.assert_close(adv, torch.cat([torch.zeros(3, dtype=torch.float64), leaves]))


def test_width_pruning_keeps_the_top_half_per_parent() -> None:
    adv = torch.tensor([0.0, 1, -1, -2, 2, 3, -3], dtype=torch.float64)
    by_reward = width_prune(small_tree(), adv, key=torch.tensor([0.0, 0, 0, 1, 3, 0, 4]))
    assert by_reward.tolist() == [0.0, 1, -1, 0, 2, 0, -3]  # inner nodes untouched; leaf 4 and leaf 6 kept
    by_abs = width_prune(small_tree(), adv, key=adv.abs())
    assert by_abs.tolist() == [0.0, 1, -1, -2, 0, 3, 0]  # ties (|-2| vs |2|): the lower node id


def test_each_edge_is_trained_with_its_child_nodes_advantage() -> None:
    rollout, backbone, schedule = sample([0, 2], 4, factor=2, prompts=2)
    rewards = RewardBatch(
        {"r": torch.randn(rollout.num_rollouts, generator=torch.Generator().manual_seed(3))}, {"r": 1}
    )
    adv = flowrl.build("advantage", {"type": "branch_depthwise"})(rewards, rollout)
    tree, t = rollout.extras["tree"], rollout.transitions
    assert isinstance(tree, Tree) and adv.nodes is not None and t.node_index is not None
    torch.testing.assert_close(adv.values, adv.nodes[tree.leaf])
    seen: list[torch.Tensor] = []

    class Capture(flowrl.PolicyLoss):
        def __call__(self, batch: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
            seen.append(batch.advantages)
            return batch.log_prob.sum() * 0, {}

    losses = transition_losses(
        backbone, schedule.kernel, Capture(None), schedule, rollout.cond, t, adv.values, 4, node_advantages=adv.nodes
    )
    with torch.no_grad():
        list(losses)
    torch.testing.assert_close(torch.cat(seen), adv.nodes[t.node_index])
    # The depth-1 edges carry the advantage of their child's leaf mean among its depth-1 siblings.
    leaf_mean = rewards.total.reshape(2, 2, 2).mean(2)  # (prompt, depth-1 node)
    expected = (leaf_mean - leaf_mean.mean(1, keepdim=True)) / (leaf_mean.std(1, unbiased=False, keepdim=True) + 1e-4)
    torch.testing.assert_close(adv.nodes[2:6], expected.flatten(), atol=1e-5, rtol=0)
    # Without node advantages, node-indexed transitions refuse to fall back to rollout advantages.
    with pytest.raises(ValueError, match="per-node advantages"):
        transition_advantages(t, adv.values, None)
    with pytest.raises(ValueError, match="needs a rollout tree"):
        flowrl.build("advantage", {"type": "branch_depthwise"})(rewards, attrs.evolve(rollout, extras={}))


class FakeAccelerator:
    """Threads as processes: ``gather`` concatenates every rank's tensor in rank order."""

    def __init__(self, rank: int, shared: dict[str, Any]) -> None:
        self.process_index, self.num_processes, self.device = rank, 2, torch.device("cpu")
        self.shared = shared

    def gather(self, value: torch.Tensor) -> torch.Tensor:
        barrier, slots = self.shared["barrier"], self.shared["slots"]
        slots[self.process_index] = value
        barrier.wait()
        out = torch.cat([slots[0], slots[1]])
        barrier.wait()
        return out


def test_tree_survives_the_gathered_view_of_two_processes() -> None:
    estimator = flowrl.build("advantage", {"type": "branch_depthwise", "width_prune": "reward"})
    both, _, _ = sample([0, 1], 3, factor=2, prompts=2)
    g = torch.Generator().manual_seed(1)
    rewards = RewardBatch({"r": torch.randn(both.num_rollouts, generator=g)}, {"r": 1.0})
    alone = estimator(rewards, both)
    halves = [sample([0, 1], 3, factor=2, prompts=1)[0] for _ in range(2)]
    shared: dict[str, Any] = {"barrier": threading.Barrier(2), "slots": [None, None]}
    results: list[Advantages | None] = [None, None]

    def run(rank: int) -> None:
        mine = RewardBatch({"r": rewards.scores["r"][rank * 4 : (rank + 1) * 4]}, {"r": 1.0})
        results[rank] = global_advantages(FakeAccelerator(rank, shared), estimator, mine, halves[rank])

    threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert results[0] is not None and results[1] is not None
    torch.testing.assert_close(torch.cat([r.values for r in results]), alone.values)  # type: ignore[union-attr]
    assert alone.nodes is not None
    tree = both.extras["tree"]
    assert isinstance(tree, Tree)
    for rank, res in enumerate(results):  # a process holds its own tree's nodes: root, 2 at depth 1, 4 leaves
        assert res is not None and res.nodes is not None
        torch.testing.assert_close(res.nodes, alone.nodes[tree.tree == rank])


def tiny_branch(**trainer: object) -> dict:
    data = tiny_recipe(**trainer)
    data["selector"] = {"type": "branch_splits", "splits": [0, 2]}
    data["sampler"] = {"type": "branch_tree", "factor": 2}
    data["advantage"] = {"type": "branch_depthwise"}
    data["loss"] = {"type": "ppo_clip", "clip_range": 1e-3}
    return data


def test_two_iterations_through_the_shared_trainer(tmp_path: Path) -> None:
    Trainer(recipe_from_dict(tiny_branch(max_steps=2)), tmp_path / "run", quiet=True).run()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(row["grad_norm"] > 0 for row in rows)
    assert abs(rows[0]["ratio_mean"] - 1) < 1e-6 and rows[0]["clip_frac"] == 0.0
    per_prompt = by_hand_nfe([0, 2], 4, 2)
    assert [r["nfe"] for r in rows] == [2 * per_prompt, 4 * per_prompt]


def test_recipe_validates(capsys: pytest.CaptureFixture[str]) -> None:
    assert flowrl_main(["validate", str(ROOT / "recipes" / "branch_grpo.toml")]) == 0
    bad = tiny_branch()
    bad["selector"] = {"type": "branch_splits", "splits": [0, 4]}
    with pytest.raises(RecipeError, match="split ends at step 5"):
        recipe_from_dict(bad)
    capsys.readouterr()


def test_plain_units_plan_also_drives_the_tree() -> None:
    backbone = flowrl.build("backbone", TINY)
    schedule = Schedule(backbone.schedule_sigmas(4, 3.0), flowrl.build("kernel", {"type": "flow_grpo_sde"}))
    sampler = flowrl.build("sampler", {"type": "branch_tree"})
    with torch.no_grad():
        rollout = sampler.rollout(backbone, ["a"], Plan((Unit(1, 2),), (0,)), schedule, RolloutRNG(0, 0, [0]))
    assert rollout.nfe == analytic_nfe(4, [(1, 2)], 2) == 1 + 1 + 2
