"""The world's edit base (flowrl.world.edit_base): the source image's tokens in the transformer's sequence, sliced
off its output; text-to-image unchanged without a condition."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import tiny_recipe

import flowrl
from flowrl.config.recipe import recipe_from_dict
from flowrl.core.conditions import Condition, ConditionError, Prompt, check_source
from flowrl.core.rng import RolloutRNG
from flowrl.world.components import BASE_MODEL
from flowrl.world.edit import Edit, balanced_edits
from flowrl.world.edit_base import SOURCE, WorldEdit
from flowrl.world.edit_render import render_edit_batch
from flowrl.world.grammar import ObjectGroup, Scene

TEXTS = ["a red circle", "two blue squares", "a green triangle above a yellow circle"]


@pytest.fixture(scope="module")
def bases() -> tuple[WorldEdit, flowrl.Backbone]:
    """The edit base and the text-to-image base on the same (shipped text-to-image) weights."""
    return (
        flowrl.build("backbone", {"type": "world_edit_tiny", "path": str(BASE_MODEL)}),
        flowrl.build("backbone", {"type": "world_tiny"}),
    )


def sources(n: int, seed: int) -> list[Condition]:
    edits = balanced_edits("train", n, seed=seed)
    return [Condition(img) for img in render_edit_batch(edits, seed=seed)[0]]


def inputs(backbone: flowrl.Backbone, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = backbone.noise(n, torch.Generator().manual_seed(0))
    return x, torch.full((n,), 0.7)


def test_without_a_condition_the_output_is_the_text_to_image_output_bit_for_bit(bases: tuple) -> None:
    edit, t2i = bases
    x, s = inputs(t2i, len(TEXTS))
    with torch.no_grad():
        assert torch.equal(edit.velocity(x, s, edit.encode(TEXTS)), t2i.velocity(x, s, t2i.encode(TEXTS)))
    assert set(edit.encode(TEXTS).tensors) == {"embeds", "pooled"}


def test_a_condition_changes_the_output_and_only_the_target_comes_back(bases: tuple) -> None:
    edit, _ = bases
    a, b = sources(2, seed=0)
    x, s = inputs(edit, 2)
    x = torch.cat([x[:1], x[:1]])
    with torch.no_grad():
        plain = edit.velocity(x, s, edit.encode(["a red circle"] * 2))
        cond = edit.encode([Prompt("a red circle", [a]), Prompt("a red circle", [b])])
        v = edit.velocity(x, s, cond)
    assert v.shape == x.shape == plain.shape and cond.tensors["source"].shape == (2, *edit.latent_shape)
    assert not torch.allclose(v[0], plain[0])  # the source changes the output
    assert not torch.allclose(v[0], v[1])  # a different source, a different output
    # the rows travel with take(): row 1 alone gives what it gave in the batch
    with torch.no_grad():
        alone = edit.velocity(x[1:], s[1:], cond.take(torch.tensor([1])))
    torch.testing.assert_close(alone, v[1:], rtol=1e-5, atol=1e-5)


def test_a_condition_is_encoded_once_per_prompt(bases: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    edit, _ = bases
    (a,) = sources(1, seed=3)
    calls: list[int] = []
    original = WorldEdit.encode_rows

    def counting(self: WorldEdit, prompts: list[str]) -> list:
        calls.append(len(prompts))
        return original(self, prompts)

    monkeypatch.setattr(WorldEdit, "encode_rows", counting)
    edit.to(torch.device("cpu"))  # a fresh cache
    p = Prompt("make the red circle green", [a])
    first = edit.encode([p, p, p])
    again = edit.encode([Prompt("make the red circle green", [Condition(np.array(a.pixels))])] * 2)
    assert calls == [1] and torch.equal(first.tensors["source"][0], again.tensors["source"][1])
    other = edit.encode([Prompt("make the red circle green", sources(1, seed=4))])
    assert calls == [1, 1] and not torch.equal(other.tensors["source"][0], first.tensors["source"][0])


def test_a_batch_mixing_prompts_with_and_without_a_source_is_refused(bases: tuple) -> None:
    edit, _ = bases
    with pytest.raises(ValueError, match="mixes prompts with and without a source image"):
        edit.encode([Prompt("a red circle", sources(1, seed=0)), "a red circle"])


def test_sources_of_another_size_are_scaled_and_cropped(bases: tuple) -> None:
    edit, _ = bases
    big = Condition(np.kron(sources(1, seed=5)[0].pixels, np.ones((2, 3, 1), np.uint8)))  # 64 x 96
    cond = edit.encode([Prompt("a red circle", [big])])
    assert cond.tensors["source"].shape == (1, *edit.latent_shape)


def test_the_base_takes_one_rgb_source_and_text_prompts_are_refused_before_it_loads() -> None:
    assert WorldEdit.accepts(WorldEdit.Config()) == SOURCE
    recipe = recipe_from_dict(
        {
            **tiny_recipe(),
            "backbone": {"type": "world_edit_tiny", "path": str(BASE_MODEL)},
        }
    )
    source = recipe.build("prompts")
    with pytest.raises(ConditionError, match=r"has no image; the backbone 'world_edit_tiny' takes exactly 1 image"):
        check_source(source, recipe.parts["backbone"])


def test_an_edit_reaches_every_rollout_of_its_group(bases: tuple) -> None:
    """The sampler knows nothing of conditions: the prompts' Conditioning rows carry the source to each rollout."""
    edit, _ = bases
    edits = [
        Edit("recolour", Scene((ObjectGroup("red", "circle"),)), colour="green"),
        Edit("count", Scene((ObjectGroup("blue", "square"),)), count=2),
    ]
    prompts = [Prompt(e.text, [Condition(img)]) for e, img in zip(edits, render_edit_batch(edits, 0)[0], strict=True)]
    sampler = flowrl.build("sampler", {"type": "independent", "group_size": 3})
    schedule = flowrl.Schedule(edit.schedule_sigmas(4, 3.0), flowrl.build("kernel", {"type": "flow_grpo_sde"}))
    plan = flowrl.Plan(units=(flowrl.Unit(0),), trained=(0,))
    rng = RolloutRNG(0, 0, range(len(prompts)))
    with torch.no_grad():
        rollout = sampler.rollout(edit, prompts, plan, schedule, rng)
    assert rollout.prompts == prompts
    rows = rollout.transitions.input_cond
    for t in range(len(rows)):
        prompt = prompts[int(rows[t])]
        assert torch.equal(rollout.cond.tensors["source"][int(rows[t])], edit.encode([prompt]).tensors["source"][0])
    assert rollout.rollout_texts() == [p for p in prompts for _ in range(3)]
