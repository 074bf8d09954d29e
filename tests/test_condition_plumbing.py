"""The condition plumbing of an edit task, checked on every shipped sampler, on sharded rollouts and micro-batches,
and through a resume: each rollout row gets its own prompt's source image, in the prompts' order, although no method
part knows about conditions (docs/editing.md).

The samplers are checked with a spy on the edit base's ``velocity``: it returns minus the packed source image it
is handed (row by row) and the rollout's noise is zero, so every latent stays proportional to the sources its
trajectory was given, and a rollout's final latent is a multiple of its prompt's source only if every evaluation
along its path (its ancestors' in a tree, the shared anchor, the ODE tails) got that source."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import ROOT, tiny_recipe
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

import flowrl
from flowrl.config.recipe import recipe_from_dict
from flowrl.core.conditions import Condition, Prompt
from flowrl.core.rng import RolloutRNG
from flowrl.core.types import Conditioning, Plan, Rollout, Schedule, Unit
from flowrl.trainer import train
from flowrl.trainer.micro_batches import forward_process_losses, transition_losses
from flowrl.world.edit import balanced_edits
from flowrl.world.edit_render import render_edit_batch


@functools.cache
def base() -> Any:
    backbone = flowrl.build("backbone", {"type": "world_edit_tiny"})
    backbone.set_reference(contextlib.nullcontext)  # untrained: the policy is its own reference (AEGPO's probe)
    return backbone


@functools.cache
def prompts() -> tuple[Prompt, ...]:
    """Five edits with distinct sources; the last repeats the first's instruction on another source."""
    edits = balanced_edits("train", 5, seed=0)
    images = render_edit_batch(edits, seed=0)[0]
    texts = [e.text for e in edits[:4]] + [edits[0].text]
    return tuple(Prompt(t, [Condition(img)]) for t, img in zip(texts, images, strict=True))


def tag(prompt: str) -> torch.Tensor:
    """The prompt's packed source image (the latent's shape): what the spy returns (negated) for its rows."""
    return base().encode([prompt]).tensors["source"][0].float()


class ZeroRNG(RolloutRNG):
    """No noise at all: latents start at 0 and SDE steps add nothing."""

    def randn(self, rows_prompt: torch.Tensor, shape: Sequence[int], device: torch.device | str = "cpu") -> Any:
        return torch.zeros((len(rows_prompt), *shape), device=device)


class Spy:
    """The edit base's velocity, recording each call's inputs and source rows. With ``tags`` it returns minus the
    source instead (after the real forward when ``probing``: AEGPO's probe reads the forward's attention)."""

    def __init__(self, backbone: Any, tags: bool, probing: bool = False) -> None:
        self.real, self.tags, self.probing = backbone.velocity, tags, probing
        self.calls: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __call__(self, x: torch.Tensor, s: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        source = cond.tensors["source"]
        self.calls.append((x.detach().clone(), source.detach().clone()))
        if not self.tags:
            return self.real(x, s, cond)
        if self.probing:
            self.real(x, s, cond)
        return -source.to(x.device).float()


def spy(monkeypatch: pytest.MonkeyPatch, tags: bool, probing: bool = False) -> Spy:
    recorder = Spy(base(), tags, probing)
    monkeypatch.setattr(base(), "velocity", recorder)
    return recorder


def misaligned(rollout: Rollout, given: Sequence[str]) -> list[str]:
    """The problems of a rollout whose rows should each carry their own prompt's source (empty: none)."""
    problems = []
    if list(rollout.prompts) != list(given):
        problems.append("the rollout's prompts are not the prompts given, in their order")
    tags = [tag(p) for p in given]
    final = rollout.final_latents.float()
    for i, p in enumerate(rollout.rollout_prompt.tolist()):
        e = tags[p]
        a = float((final[i] * e).sum() / (e * e).sum())
        residual = float((final[i] - a * e).norm() / final[i].norm())
        if not (a > 0.5 and residual < 1e-4):
            problems.append(f"rollout {i} (prompt {p}): final latent {a:.3f} x its source, residual {residual:.2e}")
    t = rollout.transitions  # at training time: the input's condition row is the rollout's prompt's
    for k in range(len(t)):
        row, rollout_prompt = int(t.input_cond[int(t.input_index[k])]), int(rollout.rollout_prompt[t.rollout_index[k]])
        if not torch.equal(rollout.cond.tensors["source"][row].float(), tags[rollout_prompt]):
            problems.append(f"transition {k}: its input's condition row {row} is not its rollout's prompt's")
    return problems


UNITS = Plan(units=(Unit(0), Unit(1)), trained=(0, 1))
SAMPLERS: dict[str, tuple[dict[str, Any], Plan]] = {
    "independent": ({"type": "independent", "group_size": 3}, UNITS),
    "independent_same_noise": ({"type": "independent", "group_size": 2, "same_noise": True}, UNITS),
    "anchor_branch": ({"type": "anchor_branch", "group_size": 2}, Plan(units=(Unit(0), Unit(1, 2)), trained=(0, 1))),
    "anchor_branch_dpm_tail": (
        {"type": "anchor_branch", "group_size": 2, "tail_solver": "dpm_solver_2m", "tail_steps": 2}, UNITS
    ),
    "tempflow_branch": ({"type": "tempflow_branch", "group_size": 2}, UNITS),
    "egrpo_granular": ({"type": "egrpo_granular", "group_size": 2, "granularities": [1, 2]}, UNITS),
    "mix_grpo_flash": ({"type": "mix_grpo_flash", "group_size": 2, "tail_steps": 2}, UNITS),
    "branch_tree": ({"type": "branch_tree", "factor": 2}, Plan(units=(Unit(0), Unit(2)), trained=(0, 1))),
    "aegpo_allocate": (
        {"type": "aegpo_allocate", "min_group": 2, "max_group": 5, "host": {"type": "independent", "group_size": 3}},
        UNITS,
    ),
    "iso_temporal": ({"type": "iso_temporal", "group_size": 2}, UNITS),
    "aegpo_allocate_anchor": (
        {"type": "aegpo_allocate", "min_group": 2, "max_group": 4, "host": {"type": "anchor_branch", "group_size": 3}},
        UNITS,
    ),
}


def schedule(kernel: str = "flow_grpo_sde") -> Schedule:
    return Schedule(base().schedule_sigmas(4, 3.0), flowrl.build("kernel", {"type": kernel}))


def roll(name: str, given: Sequence[str], rng: RolloutRNG | None = None) -> Rollout:
    config, plan = SAMPLERS[name]
    with torch.no_grad():
        return flowrl.build("sampler", config).rollout(
            base(), list(given), plan, schedule(), rng or ZeroRNG(0, 0, range(len(given)))
        )


def test_every_shipped_sampler_is_checked() -> None:
    from flowrl.core.registry import registry

    # preference_file generates nothing: its rollouts are a file's pairs, with the file's prompts and conditions
    # (tests/test_diffusion_dpo.py); it trains on the edit world below
    assert set(registry("sampler").names()) - {"preference_file"} == {c["type"] for c, _ in SAMPLERS.values()}


def ranked(current: list[list[float]], base: list[list[float]]) -> list[float]:
    """A stand-in for AEGPO's ΔEntropy (zero here: the untrained policy is its own reference) that still depends
    on each prompt's own probe: 1 + 3 x the rank of its mean current entropy in the batch."""
    means = [sum(row) / len(row) for row in current]
    return [1.0 + 3.0 * sorted(means).index(m) for m in means]


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_each_rollout_gets_its_prompts_source_in_order(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    allocating = name.startswith("aegpo")
    if allocating:  # group sizes that differ from prompt to prompt, by each prompt's probe of its own source
        monkeypatch.setattr("flowrl_zoo.aegpo.sampler.delta_entropy", ranked)
    spy(monkeypatch, tags=True, probing=allocating)
    order = [prompts()[i] for i in (3, 0, 4, 1)]  # not the source's order; two prompts share an instruction
    rollout = roll(name, order)
    assert misaligned(rollout, order) == []
    assert sorted(set(rollout.rollout_prompt.tolist())) == [0, 1, 2, 3] and len(rollout.transitions) > 0
    if allocating:  # a prompt gets the rollouts its own source earns, whatever its place in the batch
        counts = torch.bincount(rollout.rollout_prompt).tolist()
        again = roll(name, order[::-1])
        assert misaligned(again, order[::-1]) == []
        assert len(set(counts)) > 1 and torch.bincount(again.rollout_prompt).tolist() == counts[::-1]


@settings(max_examples=8, deadline=None)
@given(
    st.sampled_from(["independent", "anchor_branch", "branch_tree"]),
    st.permutations(range(5)).map(lambda p: p[:3]),
    st.integers(1, 3),
)
def test_any_order_and_group_size_keeps_the_sources_aligned(name: str, order: list[int], g: int) -> None:
    config, plan = SAMPLERS[name]
    config = {**config, "factor": g + 1} if name == "branch_tree" else {**config, "group_size": g}
    given_ = [prompts()[i] for i in order]
    recorder = Spy(base(), tags=True)
    with pytest.MonkeyPatch.context() as patch, torch.no_grad():
        patch.setattr(base(), "velocity", recorder)
        rollout = flowrl.build("sampler", config).rollout(base(), given_, plan, schedule(), ZeroRNG(0, 0, range(3)))
    assert misaligned(rollout, given_) == []


def test_a_sampler_that_hands_rows_the_wrong_source_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check can fail: the independent sampler with its rows' conditions reversed at every step."""
    from flowrl.parts.samplers import independent

    real_walk = independent.walk

    def shuffled(backbone: Any, x: Any, cond: Conditioning, rows: Any, *args: Any) -> Any:
        return real_walk(backbone, x, cond.take(torch.arange(len(cond)).flip(0)), rows, *args)

    monkeypatch.setattr(independent, "walk", shuffled)
    spy(monkeypatch, tags=True)
    order = list(prompts()[:3])
    problems = misaligned(roll("independent", order), order)
    assert len(problems) == 6 and "residual" in problems[0]  # the middle prompt's 3 rollouts happen to be right


def test_aegpos_probe_measures_each_prompt_with_its_own_source() -> None:
    """The attention entropy of a prompt is the same in a batch, alone, or in another order; the same
    instruction on another source measures differently, so a swapped source would show."""
    from flowrl_zoo.aegpo.probe import entropy_curves

    from flowrl.backbones.common.probe_options import AttentionEntropyOptions

    options, steps = AttentionEntropyOptions(), [0, 1, 2]
    order = [prompts()[i] for i in (4, 2, 0)]
    with torch.no_grad():
        batch = entropy_curves(base(), order, schedule(), options, steps, 0)
        alone = torch.cat([entropy_curves(base(), [p], schedule(), options, steps, 0) for p in order])
        flipped = entropy_curves(base(), order[::-1], schedule(), options, steps, 0)
    torch.testing.assert_close(batch, alone, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(flipped, batch.flip(0), rtol=1e-4, atol=1e-6)
    assert (batch[0] - batch[2]).abs().max() > 1e-3  # prompts 4 and 0: one instruction, two sources


def test_aegpos_base_cache_keeps_each_prompt_through_a_checkpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    """H_base is cached per prompt (its text and source) and saved in checkpoints; a resumed run reads it back
    for the same prompts, so it does not re-probe them (in other batches: other floating-point rounding)."""
    spy(monkeypatch, tags=True, probing=True)
    config, plan = SAMPLERS["aegpo_allocate"]
    sampler = flowrl.build("sampler", config)
    order = list(prompts())
    with torch.no_grad():
        sampler.rollout(base(), order, plan, schedule(), ZeroRNG(0, 0, range(5)))
    assert set(sampler.base) == set(order) and len(sampler.base) == 5
    resumed = flowrl.build("sampler", config)
    resumed.load_state_dict(sampler.state_dict())
    assert all(p in resumed.base for p in order), "the cache comes back under the instruction's text alone"


# -- sharded rollouts and micro-batches ---------------------------------------------------------
@pytest.mark.parametrize("name", ["independent", "anchor_branch", "branch_tree"])
def test_sharded_rollouts_are_the_whole_batchs_rows(name: str) -> None:
    """Two processes' slices of the global batch (the loop's ``everyone[rank * per : (rank + 1) * per]`` with
    ``first_row = rank * per``) give each prompt the rollouts the whole batch gives it, with the real forward."""
    everyone = [prompts()[i] for i in (1, 0, 4, 3)]
    whole = roll(name, everyone, RolloutRNG(7, 2, range(4)))
    shards = [roll(name, everyone[r * 2 : (r + 1) * 2], RolloutRNG(7, 2, range(r * 2, (r + 1) * 2))) for r in (0, 1)]

    def by_prompt(rollout: Rollout, offset: int) -> dict[int, torch.Tensor]:
        rows = rollout.rollout_prompt
        return {offset + p: rollout.final_latents[rows == p] for p in sorted(set(rows.tolist()))}

    parts = by_prompt(shards[0], 0) | by_prompt(shards[1], 2)
    full = by_prompt(whole, 0)
    assert sorted(parts) == sorted(full) == [0, 1, 2, 3]
    for p in full:
        torch.testing.assert_close(parts[p], full[p], rtol=1e-4, atol=1e-5)
    assert (full[1] - full[2]).abs().max() > 0.1  # one instruction on two sources: they differ


def test_update_micro_batches_give_each_input_its_prompts_source(monkeypatch: pytest.MonkeyPatch) -> None:
    """The recomputed log-densities' forwards, chunk by chunk (one input per chunk, or groups split across chunks),
    read each input's prompt's source; so do DiffusionNFT's re-noised rollouts, chunked by prompt."""
    given_ = [prompts()[i] for i in (2, 4, 0)]
    rollout = roll("anchor_branch", given_, RolloutRNG(0, 0, range(3)))
    t = rollout.transitions
    tags = [tag(p) for p in given_]
    prompt_of_input = {}
    for k in range(len(t)):
        prompt_of_input[int(t.input_index[k])] = int(rollout.rollout_prompt[t.rollout_index[k]])
    advantages = torch.linspace(-1, 1, rollout.num_rollouts)
    loss = flowrl.build("loss", {"type": "ppo_clip", "clip_range": 1e-4})
    for batch_inputs in (1, 2, 5):
        recorder = spy(monkeypatch, tags=False)
        with torch.no_grad():
            out = list(transition_losses(base(), schedule().kernel, loss, schedule(), rollout.cond, t, advantages,
                                         batch_inputs))
        assert len(out) == -(-t.num_inputs // batch_inputs)
        seen = 0
        for x, source in recorder.calls:
            for row in range(len(x)):
                (found,) = [i for i in range(t.num_inputs) if torch.equal(t.inputs[i], x[row])]
                assert torch.equal(source[row].float(), tags[prompt_of_input[found]])
                seen += 1
        assert seen == t.num_inputs

    nft = flowrl.build("loss", {"type": "diffusion_nft"})
    groups: list[torch.Tensor] = []
    real_forward_process = nft.forward_process

    def capture(batch: Any) -> Any:
        groups.append(batch.group.clone())
        return real_forward_process(batch)

    monkeypatch.setattr(nft, "forward_process", capture)
    recorder = spy(monkeypatch, tags=False)
    with torch.no_grad():
        list(forward_process_losses(base(), nft, rollout, advantages, 3, torch.Generator().manual_seed(0)))
    assert len(groups) == len(recorder.calls) > 1
    for group, (_, source) in zip(groups, recorder.calls, strict=True):
        for row, p in enumerate(group.tolist()):
            assert torch.equal(source[row].float(), tags[p])
    assert torch.equal(torch.cat(groups), rollout.rollout_prompt)


# -- resume -------------------------------------------------------------------------------------
EDIT_WORLD = {
    "backbone": {"type": "world_edit_tiny"},
    "prompts": {"type": "world_edit", "eval_count": 5, "layouts": 2},
    # the verifier often scores a whole group alike on 4 steps; a small image term makes every update move
    "reward": [{"type": "world_edit_verifier"}, {"type": "jpeg_compressibility", "scale_kb": 1.0, "weight": 0.1}],
}
MACHINE = ("wall", "time", "_s", "/s", "per_s", "mem/")  # timings and memory: the machine's, not the run's


def rows(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not any(w in k for w in MACHINE)} for line in lines]


def resumes_bitwise(data: dict[str, Any], tmp_path: Path, steps: int = 3) -> None:
    def recipe(n: int) -> Any:
        return recipe_from_dict({**data, "trainer": {**data["trainer"], "max_steps": n}})

    full = train(recipe(steps), tmp_path / "full", quiet=True)
    part = train(recipe(steps - 1), tmp_path / "part", quiet=True)
    resumed = train(recipe(steps), part, resume=part, quiet=True)
    a, b = rows(full), rows(resumed)
    assert [r["step"] for r in b] == list(range(1, steps + 1))
    assert all(r["grad_norm"] > 0 for r in a)  # every iteration moved the weights
    for ra, rb in zip(a, b, strict=True):  # a run's last iteration adds its health probes (velocity drift, KL)
        extra = {k for k in ra.keys() ^ rb.keys() if k.startswith("health/")}
        ra, rb = ({k: v for k, v in r.items() if k not in extra} for r in (ra, rb))
        assert ra == rb  # every figure of every iteration: rewards, advantages, losses, NFE and row counters
    last = f"checkpoints/step_{steps:06d}/weights.safetensors"
    wa, wb = load_file(str(full / last)), load_file(str(resumed / last))
    # exact: a resumed run replays the same prompts, sources, draws and optimiser state through the same arithmetic
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_an_edit_run_resumes_bitwise(tmp_path: Path) -> None:
    data = tiny_recipe(prompts_per_step=2, eval_every=0)
    data.update(EDIT_WORLD, sampler={"type": "independent", "group_size": 3})
    resumes_bitwise(data, tmp_path)


@pytest.mark.slow  # 40 s: AEGPO's probes on every iteration of three runs
def test_an_aegpo_edit_run_resumes_bitwise(tmp_path: Path) -> None:
    """AEGPO keeps state across iterations (its base policy's entropy per prompt): on three edits drawn again and
    again, the resumed run must read it back rather than probe again."""
    edits = balanced_edits("train", 3, seed=1)
    images = render_edit_batch(edits, seed=1)[0]
    lines = []
    for i, (edit, image) in enumerate(zip(edits, images, strict=True)):
        from PIL import Image

        Image.fromarray(image).save(tmp_path / f"{i}.png")
        lines.append(json.dumps({"prompt": edit.text, "image": f"{i}.png"}))
    (tmp_path / "edits.jsonl").write_text("\n".join(lines) + "\n")
    data = tiny_recipe(prompts_per_step=2, eval_every=0)
    data.update(
        EDIT_WORLD,
        prompts={"type": "jsonl", "path": str(tmp_path / "edits.jsonl")},
        selector={"type": "aegpo_topk", "k": 2, "mode": "topk"},
        sampler={"type": "aegpo_allocate", "min_group": 2, "max_group": 4,
                 "host": {"type": "independent", "group_size": 3}},
    )
    resumes_bitwise(data, tmp_path, steps=4)


# -- every method part trains on the edit world -------------------------------------------------
SHIPPED = sorted(p.stem for p in (ROOT / "recipes").glob("*.toml"))
# registered parts no top-level recipe uses, each swapped into a recipe that can run it
EXTRA = {
    "cps_kernel": ("flow_grpo", {"kernel": {"type": "cps", "noise_level": 0.7}}),
    "ode_kernel": ("diffusion_nft", {"kernel": {"type": "ode"}}),
    "explicit_selector": ("flow_grpo", {"selector": {"type": "explicit", "units": [[0, 1], [2, 2]]}}),
}
# shipped recipes whose own tables do not fit the edit world, and what they take there instead
EDIT_TABLES = {"diffusion_dpo_offline": {"sampler": {"type": "preference_file",
                                                     "path": str(ROOT / "recipes/data/dpo_world_edit/pairs.jsonl")}}}
METHOD = ("selector", "sampler", "kernel", "advantage", "loss")


def on_edit_world(name: str, changes: dict[str, Any] | None = None) -> Any:
    """A shipped recipe with the edit base, the edit prompts and the edit verifier, for one short iteration: its
    selector, sampler, kernel, advantage and loss unchanged (but for ``changes``)."""
    data = tomllib.loads((ROOT / "recipes" / f"{name}.toml").read_text())
    data.update({**EDIT_WORLD, "reward": EDIT_WORLD["reward"][:1]}, **EDIT_TABLES.get(name, {}), **(changes or {}))
    data["trainer"] = {**data.get("trainer", {}), "max_steps": 1, "prompts_per_step": 2, "eval_every": 0,
                       "checkpoint_every": 0, "image_every": 0, "max_minutes": 0}
    return recipe_from_dict(data, source=f"recipes/{name}.toml (edit world)")


def test_every_registered_method_part_is_trained_on_the_edit_world() -> None:
    from flowrl.core.registry import registry

    recipes = [on_edit_world(n) for n in SHIPPED] + [on_edit_world(n, c) for n, c in EXTRA.values()]
    for kind in METHOD:
        used = {r.parts[kind].type for r in recipes}
        assert set(registry(kind).names()) <= used, f"{kind}: {set(registry(kind).names()) - used} not trained"


@pytest.mark.slow
@pytest.mark.parametrize("case", SHIPPED + sorted(EXTRA))
def test_a_method_trains_an_iteration_on_the_edit_world(case: str, tmp_path: Path) -> None:
    recipe = on_edit_world(*EXTRA[case]) if case in EXTRA else on_edit_world(case)
    run = train(recipe, tmp_path / "run", quiet=True)
    (last,) = rows(run)
    assert last["step"] == 1 and math.isfinite(last["loss"]) and 0.0 <= last["reward/world_edit_verifier"] <= 1.0
    assert last["nfe"] > 0 or recipe.parts["sampler"].type == "preference_file"  # offline pairs: nothing sampled
