"""Tests of the embedded world's edit task: the edit grammar and its splits, the paired renderer, the edit verifier."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_world import _mosaic, gaussian_blur

from flowrl.world import HELDOUT_PAIRS, SPLITS, ObjectGroup, Relation, Scene, detect, verify_batch
from flowrl.world.edit import (
    EDIT_KINDS,
    HELDOUT_RECOLOURS,
    Edit,
    Instruction,
    _all_edits,
    balanced_edits,
    edit_split,
    edit_vocabulary,
    enumerate_edits,
    max_instruction_words,
    parse_instruction,
    sample_edits,
)
from flowrl.world.edit_render import WORLD_BACKGROUND, render_edit, render_edit_batch
from flowrl.world.edit_verify import check_edit, score_edit_batch, verify_edit, verify_edit_batch
from flowrl.world.render import Lattice

RED_CIRCLE, BLUE_SQUARE = ObjectGroup("red", "circle"), ObjectGroup("blue", "square")
LEFT = Scene((RED_CIRCLE, BLUE_SQUARE), Relation(0, "left of", 1))


@pytest.fixture(scope="module")
def pairs() -> dict[str, tuple[list[Edit], np.ndarray, np.ndarray]]:
    """Per split, 300 edits (60 per kind) with their rendered sources and targets."""
    out = {}
    for i, split in enumerate(SPLITS):
        edits = balanced_edits(split, 300, seed=10 + i)
        out[split] = (edits, *render_edit_batch(edits, seed=20 + i))
    return out


# ---------------------------------------------------------------- grammar


def test_examples() -> None:
    assert Edit("recolour", LEFT, 0, colour="green").text == "make the red circle green"
    assert Edit("recolour", LEFT, 0, colour="green").target.text == "a green circle left of a blue square"
    three = Scene((ObjectGroup("red", "circle", 3),))
    assert Edit("recolour", three, colour="cyan").text == "make the three red circles cyan"
    assert Edit("count", three, count=1).text == "make it a red circle"
    assert Edit("count", three, count=1).target.text == "a red circle"
    single = Scene((RED_CIRCLE,))
    add = Edit("add", single, added=BLUE_SQUARE, relation="above")
    assert (add.text, add.target.text) == ("add a blue square above the red circle", "a blue square above a red circle")
    assert Edit("remove", LEFT, 1).target.text == "a red circle"
    move = Edit("move", LEFT, 0, relation="below")
    assert move.text == "move the red circle below the blue square"
    assert move.target.text == "a red circle below a blue square"
    other = Edit("move", LEFT, 1, relation="above")  # the square moves above the circle: the circle is below it
    assert other.text == "move the blue square above the red circle"
    assert other.target == move.target


@pytest.mark.parametrize(
    ("kind", "source", "kwargs"),
    [
        ("recolour", LEFT, {"colour": "red"}),  # the same colour
        ("recolour", LEFT, {"colour": "blue", "group": 1}),  # the blue square to blue: no change
        ("recolour", Scene((RED_CIRCLE, ObjectGroup("green", "circle"))), {"colour": "green"}),  # two green circles
        ("add", LEFT, {"added": ObjectGroup("green", "circle"), "relation": "above"}),  # adds to single objects only
        ("add", Scene((RED_CIRCLE,)), {"added": RED_CIRCLE, "relation": "above"}),  # the same pair twice
        ("remove", Scene((RED_CIRCLE,)), {}),  # nothing would be left
        ("count", Scene((RED_CIRCLE,)), {"count": 1}),  # the same count
        ("count", LEFT, {"count": 2}),
        ("move", LEFT, {"relation": "right of"}),  # the opposite side: not on the world's board
        ("move", Scene((RED_CIRCLE, BLUE_SQUARE)), {"relation": "above"}),  # no relation to move across
        ("remove", LEFT, {"group": 2}),
    ],
)
def test_invalid_edits_are_refused(kind: str, source: Scene, kwargs: dict) -> None:
    with pytest.raises(ValueError):
        Edit(kind, source, **kwargs)


def test_every_edit_round_trips_and_changes_the_scene() -> None:
    edits = _all_edits()
    vocab = set(edit_vocabulary())
    assert {e.kind for e in edits} == set(EDIT_KINDS)
    for edit in edits:
        assert parse_instruction(edit.text) == edit.instruction
        assert edit.target != edit.source  # every edit asks for a change
        assert set(edit.text.split()) <= vocab and len(edit.text.split()) <= max_instruction_words()
    assert max(len(e.text.split()) for e in edits) == max_instruction_words()


@pytest.mark.parametrize(
    "text",
    [
        "",
        "paint the red circle green",
        "make the a red circle green",
        "make the red circle",
        "make the red circle purple",
        "make it four red circles",
        "remove the red circles",
        "remove red circle",
        "add the blue square left of the red circle",
        "add a blue square near the red circle",
        "move the red circle left of the blue square now",
        "move the red circle left of blue square",
    ],
)
def test_instructions_outside_the_grammar_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_instruction(text)


def test_splits_are_disjoint_complete_and_deterministic() -> None:
    every = {split: enumerate_edits(split) for split in SPLITS}
    sets = {split: set(edits) for split, edits in every.items()}
    assert sum(len(s) for s in sets.values()) == len(set(_all_edits())) == len(_all_edits())
    assert not sets["train"] & sets["test"] and not sets["train"] & sets["novel"] and not sets["test"] & sets["novel"]
    for split, edits in every.items():
        assert all(edit_split(e) == split for e in edits)
    for kind in EDIT_KINDS:  # train and test divide every kind in half
        train, test = (sum(e.kind == kind for e in every[s]) for s in ("train", "test"))
        assert train == test > 0 and any(e.kind == kind for e in every["novel"])
    for edit in every["novel"]:
        pairs = {g.pair for g in (*edit.source.groups, *edit.target.groups)}
        held_recolour = edit.kind == "recolour" and (edit.named.colour, edit.colour) in HELDOUT_RECOLOURS
        assert pairs & HELDOUT_PAIRS or held_recolour
    for edit in every["train"] + every["test"]:
        assert not {g.pair for g in (*edit.source.groups, *edit.target.groups)} & HELDOUT_PAIRS
        assert not (edit.kind == "recolour" and (edit.named.colour, edit.colour) in HELDOUT_RECOLOURS)
    # the held-out colour changes are new compositions: both colours are recoloured elsewhere in train
    train_changes = {(e.named.colour, e.colour) for e in every["train"] if e.kind == "recolour"}
    assert {c for change in HELDOUT_RECOLOURS for c in change} <= {c for change in train_changes for c in change}
    assert enumerate_edits("test") == every["test"]


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31), st.sampled_from(SPLITS))
def test_sampling_is_deterministic_and_stays_in_its_split(seed: int, split: str) -> None:
    edits = sample_edits(split, 40, seed)
    assert edits == sample_edits(split, 40, seed)
    assert all(edit_split(e) == split for e in edits)
    assert {e.kind for e in sample_edits(split, 10, seed, kinds=("move",))} == {"move"}


def test_balanced_edits_take_turns() -> None:
    edits = balanced_edits("test", 100, seed=3)
    assert [e.kind for e in edits[:10]] == list(EDIT_KINDS) * 2
    counts = [e for e in edits if e.kind == "count"]
    assert len(set(counts)) == len(counts) == 20  # 36 count edits in test: no repeats before all were drawn
    assert balanced_edits("test", 100, seed=3) == edits != balanced_edits("test", 100, seed=4)
    with pytest.raises(ValueError):
        balanced_edits("heldout", 1, seed=0)
    with pytest.raises(ValueError):
        sample_edits("train", 1, seed=0, kinds=("rotate",))


# ---------------------------------------------------------------- paired renderer


@pytest.mark.parametrize("split", SPLITS)
def test_rendered_pairs_show_the_source_and_target_scenes(split: str, pairs: dict) -> None:
    edits, sources, targets = pairs[split]
    assert all(v.strict for v in verify_batch(sources, [e.source for e in edits]))
    assert all(v.strict for v in verify_batch(targets, [e.target for e in edits]))


@pytest.mark.parametrize("split", SPLITS)
def test_rendered_target_verifies_strict_and_the_source_fails(split: str, pairs: dict) -> None:
    edits, sources, targets = pairs[split]
    texts = [e.text for e in edits]
    for edit, verdict in zip(edits, verify_edit_batch(targets, sources, texts), strict=True):
        assert verdict.strict == 1 and verdict.score == 1.0, (edit, verdict)
    for edit, verdict in zip(edits, verify_edit_batch(sources, sources, texts), strict=True):
        assert verdict.strict == 0 and verdict.score == 0.0, (edit, verdict)  # copying the source follows nothing


def test_pairs_share_everything_outside_the_edit() -> None:
    """Kept objects are pixel-identical in both images: only the cells of edited objects differ."""
    for edit in balanced_edits("train", 40, seed=5):
        source, target = render_edit(edit, np.random.default_rng(1))
        changed = np.argwhere((source != target).any(-1))
        cells = {(int(y) // 8, int(x) // 8) for y, x in changed}
        assert 1 <= len(cells) <= 2 * max(g.count for g in edit.source.groups) + 1
        background = (source == target).all(-1) & (source == WORLD_BACKGROUND[0]).all(-1)
        assert background.sum() > 32 * 32 // 2


@pytest.mark.parametrize("split", SPLITS)
def test_the_verifier_survives_mild_blur_and_noise(split: str, pairs: dict) -> None:
    edits, sources, targets = pairs[split]
    noisy = gaussian_blur(targets, 0.7) / 255 + np.random.default_rng(0).normal(0, 0.03, targets.shape)
    _, strict = score_edit_batch(np.clip(noisy, 0, 1).astype(np.float32), sources, [e.text for e in edits])
    assert strict.mean() >= 0.99


def test_batches_drawn_in_parts_equal_the_batch_at_once() -> None:
    edits = balanced_edits("test", 12, seed=0)
    whole = render_edit_batch(edits, seed=4)
    parts = [render_edit_batch(edits[:5], seed=4), render_edit_batch(edits[5:], seed=4, start=5)]
    for i in range(2):
        np.testing.assert_array_equal(whole[i], np.concatenate([p[i] for p in parts]))
    assert not np.array_equal(whole[0], render_edit_batch(edits, seed=5)[0])


@pytest.mark.parametrize(("lattice", "flat"), [(None, ()), (Lattice(4), ())], ids=["anywhere", "4px-cells"])
def test_the_renderers_other_forms_draw_verified_pairs(lattice: Lattice | None, flat: tuple) -> None:
    edits = balanced_edits("train", 60, seed=7)
    sources, targets = render_edit_batch(edits, seed=8, lattice=lattice, flat=flat)
    scores, strict = score_edit_batch(targets, sources, [e.text for e in edits])
    assert strict.mean() >= 0.95 and scores.mean() >= 0.95


# ---------------------------------------------------------------- verifier


def _free_cell(*images: np.ndarray) -> tuple[int, int] | None:
    """A cell of the 4 x 4 board whose 3 x 3 neighbourhood of cells is all background in every image (a place to
    move to that is no object's place)."""
    grey = np.all([(image == WORLD_BACKGROUND[0]).all(-1) for image in images], axis=0)
    for cy in range(4):
        for cx in range(4):
            y0, y1, x0, x1 = max(0, cy - 1) * 8, min(4, cy + 2) * 8, max(0, cx - 1) * 8, min(4, cx + 2) * 8
            if grey[y0:y1, x0:x1].all():
                return cy, cx
    return None


def _kept(edit: Edit) -> tuple[str, str]:
    """A pair the edit keeps in place: the other group, or a recoloured group in its new colour."""
    if edit.kind in ("remove", "move"):
        return edit.source.groups[1 - edit.group].pair
    if edit.kind == "add":
        return edit.named.pair
    if edit.kind == "recolour":
        return (edit.colour, edit.named.shape)
    return edit.named.pair


@pytest.mark.parametrize("kind", EDIT_KINDS)
def test_moving_a_kept_object_loses_the_preservation_credit(kind: str) -> None:
    edits = balanced_edits("train", 20, seed=11, kinds=(kind,))
    sources, targets = render_edit_batch(edits, seed=12)
    tried = 0
    for edit, source, target in zip(edits, sources, targets, strict=True):
        pair, places = _kept(edit), [d.centroid for d in detect(source)]
        found = [
            d
            for d in detect(target)
            if d.pair == pair and any(np.hypot(*np.subtract(d.centroid, p)) < 1 for p in places)
        ]
        cell = _free_cell(target, source)
        if not found or cell is None:
            continue
        x0, y0, x1, y1 = found[0].box
        cx, cy = x0 // 8 * 8, y0 // 8 * 8
        broken = target.copy()
        patch = target[cy : cy + 8, cx : cx + 8].copy()
        broken[cy : cy + 8, cx : cx + 8] = WORLD_BACKGROUND[0]
        broken[cell[0] * 8 : cell[0] * 8 + 8, cell[1] * 8 : cell[1] * 8 + 8] = patch
        good, bad = verify_edit(target, source, edit.text), verify_edit(broken, source, edit.text)
        assert bad.strict == 0 and bad.preserve_score < good.preserve_score == 1.0, (edit, bad)
        assert bad.score < good.score
        if kind in ("recolour", "remove", "count"):  # the instruction itself is still followed
            assert bad.follow_score == 1.0, (edit, bad)
        tried += 1
    assert tried >= 5


def test_clutter_and_partial_edits_score_below_the_clean_result() -> None:
    source, target = render_edit(Edit("recolour", LEFT, 0, colour="green"), np.random.default_rng(2))
    clean = verify_edit(target, source, "make the red circle green")
    cell = _free_cell(target)
    assert cell is not None
    cluttered = target.copy()
    cluttered[cell[0] * 8 + 1 : cell[0] * 8 + 7, cell[1] * 8 + 1 : cell[1] * 8 + 7] = (240, 220, 35)  # a yellow square
    extra = verify_edit(cluttered, source, "make the red circle green")
    assert (clean.strict, clean.score) == (1, 1.0)
    assert extra.strict == 0 and extra.extra == 1 and extra.score < 1.0 and extra.follow_score == 1.0
    # the wrong object recoloured: the instruction is not followed and the square is not kept
    wrong = verify_edit(target, source, "make the blue square green")
    assert wrong.strict == 0 and wrong.follow_score < 1
    blank = np.full_like(target, 60)
    for text in ("make the red circle green", "remove the blue square", "move the red circle above the blue square"):
        assert verify_edit(blank, source, text).score == 0.0  # nothing drawn keeps nothing


def test_mosaics_and_floods_score_nothing_as_edits() -> None:
    """The world's hacking probes as edit results: colour mosaics in 2, 4 and 8 px blocks and every colour at once
    follow no instruction and keep nothing, and so does the source itself."""
    from flowrl.world.grammar import COLOURS

    edits = balanced_edits("test", 100, seed=5)
    sources, targets = render_edit_batch(edits, seed=6)
    texts = [e.text for e in edits]
    rng = np.random.default_rng(7)
    stripes = np.full((32, 32, 3), 60, dtype=np.uint8)
    for i, rgb in enumerate(COLOURS.values()):
        stripes[:, i * 5 : i * 5 + 5] = rgb
    attacks = {f"mosaic {b} px": np.stack([_mosaic(rng, b) for _ in edits]) for b in (2, 4, 8)}
    attacks |= {"every colour": np.stack([stripes] * len(edits)), "the source": sources}
    for name, images in attacks.items():
        scores, strict = score_edit_batch(images, sources, texts)
        assert scores.max() == 0 and strict.max() == 0, name
    assert score_edit_batch(targets, sources, texts)[1].min() == 1


def test_per_kind_constraints_are_named() -> None:
    source, target = render_edit(
        Edit("count", Scene((ObjectGroup("red", "circle", 3),)), count=2), np.random.default_rng(0)
    )
    verdict = verify_edit(target, source, "make it two red circles")
    dropped = next(
        d for d in detect(source) if not any(np.hypot(*np.subtract(d.centroid, t.centroid)) < 1 for t in detect(target))
    )
    at = f"({dropped.centroid[0]:.0f}, {dropped.centroid[1]:.0f})"
    assert [name for name, _ in verdict.follow] == ["red circle count == 2", f"no trace of red circle at {at}"]
    kept = ["red circle 1 of 2 kept in place", "red circle 2 of 2 kept in place"]
    assert [name for name, _ in verdict.preserve] == kept
    assert verdict.strict == 1


def test_an_instruction_that_does_not_match_its_source_is_an_error() -> None:
    source, _ = render_edit(Edit("remove", LEFT, 1), np.random.default_rng(0))
    found = detect(source)
    with pytest.raises(ValueError, match="names two red circles; the source shows blue square, red circle"):
        check_edit(found, found, "make the two red circles green")
    with pytest.raises(ValueError, match="names a green triangle"):
        check_edit(found, found, Instruction("remove", ObjectGroup("green", "triangle")))
    with pytest.raises(ValueError):
        verify_edit_batch(np.zeros((2, 32, 32, 3), np.uint8), np.zeros((1, 32, 32, 3), np.uint8), ["x", "y"])


def test_kinds_are_evenly_represented_in_evaluation() -> None:
    edits = balanced_edits("test", 256, seed=1234)
    assert collections.Counter(e.kind for e in edits) == {k: 256 // 5 + (i < 256 % 5) for i, k in enumerate(EDIT_KINDS)}


@pytest.mark.parametrize("kind", ["remove", "move", "count"])
def test_a_faint_copy_left_where_an_object_was_is_not_a_clean_edit(kind: str) -> None:
    """A blend of source and target (the taken-away object faded to 30-40%, under the detector's 50% coverage):
    the old detections alone would pass it as done (they did: strict 0.77 at 60% target); the trace constraint
    refuses it, and a fainter copy than the detector's noise floor (10%) still passes."""
    drawn = balanced_edits("test", 200, seed=3, kinds=(kind,))
    edits = [e for e in drawn if kind != "count" or e.count < e.named.count][:30]
    sources, targets = render_edit_batch(edits, seed=4)
    texts = [e.text for e in edits]
    ghosts = {a: ((1 - a) * sources + a * targets.astype(np.float64)).round().astype(np.uint8) for a in (0.6, 0.9)}
    faded, faint = verify_edit_batch(ghosts[0.6], sources, texts), verify_edit_batch(ghosts[0.9], sources, texts)
    traced = [v for v in faded if any(name.startswith("no trace") and not ok for name, ok in v.follow)]
    assert len(traced) >= 0.9 * len(edits) and all(v.strict == 0 for v in traced)
    assert np.mean([v.strict for v in faint]) >= 0.9
