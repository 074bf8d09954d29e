"""Which parts compose (docs/composition.md): the whole pair matrix through validate, a sample of the composing
pairs trained for one iteration (all of them in the slow test), the refusals one line each and needed, and the
declaration mechanism of flowrl.core.contracts on its own."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch

from flowrl import Plan, Schedule, TimestepSelector, Unit
from flowrl.cli.main import main
from flowrl.config.recipe import RecipeError, recipe_from_dict
from flowrl.core.contracts import Need, needs, provided, refuses, required
from flowrl.core.registry import registry
from flowrl.trainer import train

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import gen_composition as gen  # noqa: E402

# Read from the parts' contracts (docs/composition.md, "Why pairs are refused"), not from validate: the pairs that
# cannot work, and the word each refusal must carry. Everything else in the four matrices must compose.
REFUSED = {
    ("selector", "sampler"): {
        ("egrpo_entropy", "tempflow_branch"): "merged units",
        ("nft_rollouts", "anchor_branch"): "train no unit",
        ("nft_rollouts", "tempflow_branch"): "train no unit",
        ("nft_rollouts", "branch_tree"): "train no unit",
        ("nft_rollouts", "egrpo_granular"): "train no unit",
        ("flow_grpo_prefix", "branch_tree"): "every step",
        ("dance_random_subset", "branch_tree"): "every step",
        ("tempflow_steps", "branch_tree"): "every step",
    },
    ("sampler", "advantage"): {
        **{(s, "branch_depthwise"): "rollout trees"
           for s in ("aegpo_allocate", "anchor_branch", "independent", "mix_grpo_flash", "tempflow_branch")},
        **{(s, "egrpo_granular"): "rollouts finishing every jump"
           for s in ("aegpo_allocate", "anchor_branch", "branch_tree", "independent", "mix_grpo_flash",
                     "tempflow_branch")},
        ("egrpo_granular", "group_norm"): "sum each jump's granularities",
        ("egrpo_granular", "branch_depthwise"): "sum each jump's granularities",
    },
    ("sampler", "loss"): {},
    ("selector", "loss"): {("nft_rollouts", loss): "train no unit" for loss in ("ppo_clip", "grpo_guard", "flow_dppo")},
}


@pytest.fixture(scope="module")
def found() -> dict[tuple[str, str], list[gen.Outcome]]:
    return gen.outcomes()


def test_the_page_is_current(found: dict[tuple[str, str], list[gen.Outcome]]) -> None:
    """docs/composition.md is what the registries and the parts' declarations give (regenerate it otherwise)."""
    page = (ROOT / "docs" / "composition.md").read_text(encoding="utf-8")
    assert page == gen.render(found), "docs/composition.md is out of date: run python scripts/gen_composition.py"


# The parts the expectations above were written for; a part registered later is held to the one-line rule only.
DECIDED = {
    "selector": {"aegpo_topk", "branch_splits", "dance_random_subset", "egrpo_entropy", "explicit",
                 "flow_grpo_fast_window", "flow_grpo_prefix", "mix_grpo_window", "nft_rollouts", "tempflow_steps"},
    "sampler": {"aegpo_allocate", "anchor_branch", "branch_tree", "egrpo_granular", "independent", "mix_grpo_flash",
                "tempflow_branch"},
    "advantage": {"branch_depthwise", "egrpo_granular", "group_norm"},
    "loss": {"crd", "diffusion_nft", "flow_dppo", "grpo_guard", "ppo_clip"},
}


def test_the_whole_matrix_through_validate(found: dict[tuple[str, str], list[gen.Outcome]]) -> None:
    """Every registered pair of the four matrices either validates or is refused; among the parts above, exactly
    the pairs the contracts rule out are refused, and every refusal is one line naming the part that refuses (and
    the part it refuses, or that no part provides what it needs)."""
    names = gen.registered()
    for kinds, outcomes in found.items():
        assert len(outcomes) == len(names[kinds[0]]) * len(names[kinds[1]])
        decided = [o for o in outcomes if o.pair[0] in DECIDED[kinds[0]] and o.pair[1] in DECIDED[kinds[1]]]
        assert {o.pair for o in decided if not o.composes} == set(REFUSED[kinds]), kinds
        for o in outcomes:
            if not o.composes:
                assert "\n" not in o.reason and (f"'{o.pair[0]}'" in o.reason or f"'{o.pair[1]}'" in o.reason), o
                assert "cannot take" in o.reason or "which no part provides" in o.reason, o
                assert REFUSED[kinds].get(o.pair, "") in o.reason, o


def test_a_tree_with_a_group_estimator_needs_a_forward_process_loss() -> None:
    """branch_tree x group_norm: refused with a policy loss (its edges need per-node advantages), valid with a
    forward-process loss, which reads the leaves' advantages."""
    choice = {**gen.DEFAULTS, "sampler": "branch_tree", "selector": "branch_splits"}
    (problem,) = gen.problems_of(choice)
    assert problem[0] == "sampler" and "per-node advantages" in problem[1] and "branch_depthwise" in problem[1]
    assert gen.problems_of({**choice, "loss": "diffusion_nft"}) == []
    assert gen.problems_of({**choice, "advantage": "branch_depthwise"}) == []


def test_an_allocator_takes_its_host_declarations() -> None:
    """aegpo_allocate runs a host sampler: a host that refuses merged units makes the allocator refuse them."""
    data = gen.recipe_data({**gen.DEFAULTS, "selector": "egrpo_entropy"})
    data["sampler"] = {"type": "aegpo_allocate", "host": {"type": "tempflow_branch", "group_size": 2}}
    with pytest.raises(RecipeError) as refused:
        recipe_from_dict(data)
    assert "[sampler] sampler 'aegpo_allocate' cannot take merged units" in str(refused.value)
    data["sampler"]["host"]["type"] = "anchor_branch"
    recipe_from_dict(data)


def test_settings_decide_what_a_selector_provides() -> None:
    """A selector merges steps only with some settings, and only then is tempflow_branch refused."""
    choice = {**gen.DEFAULTS, "sampler": "tempflow_branch"}
    cases: list[tuple[str, dict[str, Any], bool]] = [
        ("explicit", {"units": [[0, 2]]}, True),
        ("explicit", {"units": [[0, 1], [2, 1]]}, False),
        ("egrpo_entropy", {"max_merge": 1, "tau": 0.5}, False),
        ("aegpo_topk", {"k": 2, "unit_rule": "egrpo"}, True),
        ("aegpo_topk", {"k": 2, "unit_rule": "single"}, False),
    ]
    for selector, table, merges in cases:
        data = gen.recipe_data({**choice, "selector": selector})
        data["selector"] = {"type": selector, **table}
        if merges:
            with pytest.raises(RecipeError, match="cannot take merged units"):
                recipe_from_dict(data)
        else:
            recipe_from_dict(data)


def test_validate_refuses_in_one_line_with_status_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The command: exit status 2, the file and the reason on one line each, no traceback."""
    from flowrl.config.tomlwrite import dumps

    path = tmp_path / "tree.toml"
    path.write_text(dumps(gen.recipe_data({**gen.DEFAULTS, "selector": "flow_grpo_prefix", "sampler": "branch_tree",
                                           "advantage": "branch_depthwise"})))
    assert main(["validate", str(path)]) == 2
    out = capsys.readouterr()
    lines = (out.out + out.err).strip().splitlines()
    assert lines == [
        f"recipe error: 1 problem in {path}",
        "  [sampler] sampler 'branch_tree' cannot take plans with an SDE unit at every step, which selector"
        " 'flow_grpo_prefix' gives: the tree splits at every unit, so it would have factor ** num_steps leaves per"
        " prompt (1024 on a 10-step grid with factor 2); choose the split steps with branch_splits",
    ]


def unchecked(choice: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> object:
    """The recipe as it would load without the composition check."""
    import flowrl.config.recipe

    monkeypatch.setattr(flowrl.config.recipe, "composition_checks", lambda recipe: iter(()))
    return recipe_from_dict(gen.recipe_data(choice))


@pytest.mark.parametrize(
    ("choice", "failure"),
    [
        ({"selector": "egrpo_entropy", "sampler": "tempflow_branch"}, "merges steps"),
        ({"selector": "nft_rollouts", "sampler": "anchor_branch", "loss": "diffusion_nft"}, "non-empty"),
        ({"selector": "explicit", "sampler": "branch_tree"}, "per-node advantages"),
        ({"selector": "explicit", "sampler": "independent", "advantage": "branch_depthwise"}, "rollout tree"),
        ({"selector": "nft_rollouts", "sampler": "independent"}, "trained nothing"),
    ],
)
def test_each_refusal_is_needed(
    choice: dict[str, str], failure: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the check the pair fails mid-run (a crash, or a run that trains nothing): the refusal is not
    cosmetic. Should a part learn to handle the pair, this fails and the declaration can go."""
    torch.set_num_threads(1)
    recipe = unchecked({**gen.DEFAULTS, **choice}, monkeypatch)
    with pytest.raises(Exception, match=failure):
        train(recipe, tmp_path / "run", quiet=True)  # type: ignore[arg-type]


def trained_once(choice: dict[str, str], folder: Path) -> dict:
    """Train one iteration; its metrics row."""
    torch.set_num_threads(1)
    run = train(recipe_from_dict(gen.recipe_data(choice)), folder / "run", quiet=True)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return rows[-1]


SAMPLE = [  # composing pairs with the partners the page names, one for each way parts meet
    {"selector": "aegpo_topk", "sampler": "tempflow_branch"},
    {"selector": "egrpo_entropy", "sampler": "anchor_branch", "loss": "grpo_guard"},
    {"selector": "branch_splits", "sampler": "branch_tree", "advantage": "branch_depthwise", "loss": "flow_dppo"},
    {"selector": "branch_splits", "sampler": "branch_tree", "loss": "crd"},  # a tree with group_norm
    {"selector": "nft_rollouts", "sampler": "mix_grpo_flash", "loss": "diffusion_nft"},
    {"selector": "nft_rollouts", "sampler": "preference_file", "advantage": "preference", "loss": "diffusion_dpo"},
]


@pytest.mark.parametrize("choice", SAMPLE, ids=lambda c: "-".join(c.values()))
def test_a_sample_of_composing_pairs_trains(choice: dict[str, str], tmp_path: Path) -> None:
    """One iteration with a finite loss and a gradient (the update ran on something)."""
    full = {**gen.DEFAULTS, **choice}
    assert gen.problems_of(full) == []
    row = trained_once(full, tmp_path)
    assert row["step"] == 1 and math.isfinite(row["loss"]) and row["grad_norm"] > 0, row


@pytest.mark.slow
def test_every_composing_pair_trains(found: dict[tuple[str, str], list[gen.Outcome]], tmp_path: Path) -> None:
    """The page's every **yes**, with the partners it names, trains one iteration."""
    failures = []
    for kinds, outcomes in found.items():
        for i, o in enumerate(x for x in outcomes if x.composes):
            choice = {**gen.DEFAULTS, **o.partners, **dict(zip(kinds, o.pair, strict=True))}
            try:
                row = trained_once(choice, tmp_path / f"{kinds[0]}-{kinds[1]}-{i}")
                if not (math.isfinite(row["loss"]) and row["grad_norm"] > 0):
                    failures.append(f"{o.pair}: {row}")
            except Exception as error:  # collected, so one run lists every failing pair
                failures.append(f"{o.pair}: {type(error).__name__}: {error}")
    assert not failures, "\n".join(failures)


# -- the mechanism on its own ----------------------------------------------------------------------------------------
@attrs.frozen
class _Empty:
    pass


class _Base(TimestepSelector):
    Config = _Empty
    provides: Any = frozenset({"a"})
    requires: Any = (needs("b", "base needs b"),)

    def plan(self, schedule: Schedule, iteration: int, generator: torch.Generator) -> Plan:
        return Plan(units=(Unit(0),), trained=(0,))


class _Child(_Base):
    @staticmethod
    def provides(config: object) -> frozenset[str]:
        return frozenset({"c"})

    requires = (refuses("d", "child refuses d", when="e"),)


def test_declarations_add_up_along_the_class_hierarchy() -> None:
    assert provided(_Child, _Empty()) == {"a", "c"}
    assert [n.token for n in required(_Child, _Empty())] == ["d", "b"]
    assert required(_Child, _Empty())[0] == Need("d", "child refuses d", present=False, when="e")
    loss: Any = registry("loss").get("ppo_clip")
    tokens = provided(loss, loss.Config())
    assert "policy_loss" in tokens and "forward_process_loss" not in tokens


def test_a_plugin_token_and_a_conditional_need(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plugin's own token works like the shared ones; a ``when`` need holds only when its token is provided."""
    import flowrl_zoo.branch_grpo.sampler as tree

    monkeypatch.setattr(tree.BranchTreeSampler, "requires", tree.BranchTreeSampler.requires
                        + (needs("plugin_token", "a plugin's need", when="forward_process_loss"),))
    choice = {**gen.DEFAULTS, "selector": "branch_splits", "sampler": "branch_tree", "advantage": "branch_depthwise"}
    assert gen.problems_of(choice) == []  # a policy loss: the need does not apply
    (problem,) = gen.problems_of({**choice, "loss": "crd"})
    assert problem == (
        "sampler",
        "sampler 'branch_tree' with a forward-process loss needs 'plugin_token', which no part provides:"
        " a plugin's need",
    )


def test_a_malformed_declaration_is_named() -> None:
    class Bad(_Base):
        requires = ("b",)  # a bare token, not a Need

    with pytest.raises(TypeError, match="Bad.requires must hold flowrl.core.contracts.Need"):
        required(Bad, _Empty())
