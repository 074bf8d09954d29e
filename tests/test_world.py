"""Tests of the embedded world: grammar, renderer and verifier."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flowrl.world import (
    COLOUR_NAMES,
    COLOURS,
    HELDOUT_PAIRS,
    KINDS,
    PRETRAIN_SPLITS,
    RELATIONS,
    SHAPES,
    SPLITS,
    TRAIN_PAIRS,
    ObjectGroup,
    Relation,
    Scene,
    balanced_scenes,
    detect,
    enumerate_scenes,
    max_prompt_words,
    parse,
    render,
    render_batch,
    sample_scenes,
    scene_split,
    score_batch,
    verify,
    verify_batch,
    vocabulary,
)
from flowrl.world.render import Lattice, background, coverage, layout, relation_holds

N_EVAL = 500


def gaussian_blur(images: np.ndarray, sigma: float) -> np.ndarray:
    """Separable Gaussian blur of ``(B, H, W, 3)`` images (edge padding), as float32."""
    t = np.arange(-2, 3, dtype=np.float32)
    k = np.exp(-(t**2) / (2 * sigma**2))
    k /= k.sum()
    x = np.pad(images.astype(np.float32), ((0, 0), (2, 2), (2, 2), (0, 0)), mode="edge")
    h, w = images.shape[1:3]
    x = sum(k[i] * x[:, :, i : i + w] for i in range(5))
    return sum(k[i] * x[:, i : i + h] for i in range(5))


@st.composite
def scenes(draw: st.DrawFn) -> Scene:
    """Any valid scene, built from the grammar's parts."""
    pair = st.tuples(st.sampled_from(COLOUR_NAMES), st.sampled_from(SHAPES))
    if draw(st.booleans()):
        return Scene((ObjectGroup(*draw(pair), draw(st.integers(1, 3))),))
    first = draw(pair)
    second = draw(pair.filter(lambda p: p != first))
    rel = draw(st.none() | st.sampled_from(RELATIONS).map(lambda r: Relation(0, r, 1)))
    return Scene((ObjectGroup(*first), ObjectGroup(*second)), rel)


@pytest.fixture(scope="module")
def ground_truth() -> dict[str, tuple[list[Scene], np.ndarray]]:
    out = {}
    for i, split in enumerate(SPLITS):
        sc = sample_scenes(split, N_EVAL, seed=100 + i)
        out[split] = (sc, render_batch(sc, seed=200 + i))
    return out


# ---------------------------------------------------------------- grammar


@settings(max_examples=300, deadline=None)
@given(scenes())
def test_parse_inverts_text(scene: Scene) -> None:
    assert parse(scene.text) == scene
    assert len(scene.text.split()) <= max_prompt_words()


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2**31), st.sampled_from(SPLITS))
def test_sampled_scenes_round_trip(seed: int, split: str) -> None:
    for scene in sample_scenes(split, 20, seed):
        assert parse(scene.text) == scene
        assert scene_split(scene) == split


@pytest.mark.parametrize(
    "text",
    [
        "",
        "a red circles",
        "two red circle",
        "four red circles",
        "a purple circle",
        "a red hexagon",
        "a red circle and a red circle",
        "two red circles and a blue square",
        "a red circle left a blue square",
        "a red circle and",
        "a red circle and a blue square and a green triangle",
        "A red circle",
    ],
)
def test_parse_rejects_text_outside_grammar(text: str) -> None:
    with pytest.raises(ValueError):
        parse(text)


def test_examples() -> None:
    assert Scene((ObjectGroup("red", "circle"),)).text == "a red circle"
    assert Scene((ObjectGroup("blue", "square", 2),)).text == "two blue squares"
    rel = Scene((ObjectGroup("blue", "square"), ObjectGroup("yellow", "triangle")), Relation(0, "left of", 1))
    assert rel.text == "a blue square left of a yellow triangle"
    assert rel.kind == "relation" and rel.num_objects == 2
    with pytest.raises(ValueError):
        Scene((ObjectGroup("red", "circle"), ObjectGroup("blue", "square")), Relation(1, "above", 0))
    with pytest.raises(ValueError):
        ObjectGroup("red", "circle", 4)


def test_novel_compositions_never_in_train_or_test() -> None:
    seen = sample_scenes(PRETRAIN_SPLITS, 5000, seed=1)
    novel = sample_scenes("novel", 5000, seed=2)
    seen_pairs = {g.pair for s in seen for g in s.groups}
    assert not seen_pairs & HELDOUT_PAIRS
    assert all(any(g.pair in HELDOUT_PAIRS for g in s.groups) for s in novel)
    assert {g.pair for s in novel for g in s.groups} >= HELDOUT_PAIRS
    # novel prompts are new compositions of words all seen in train
    train_words = {w for s in enumerate_scenes("train") for w in s.text.split()}
    assert {w for s in novel for w in s.text.split()} <= train_words
    assert {s.kind for s in seen} == {s.kind for s in novel} == set(KINDS)
    assert not {s.text for s in seen} & {s.text for s in novel}


def test_train_and_test_split_every_kind_in_half_with_the_same_pairs() -> None:
    train, test = enumerate_scenes("train"), enumerate_scenes("test")
    assert not set(train) & set(test)
    for kind in KINDS:
        assert sum(s.kind == kind for s in train) == sum(s.kind == kind for s in test) > 0
    pairs = {s_: {g.pair for s in enumerate_scenes(s_) for g in s.groups} for s_ in ("train", "test")}
    assert pairs["train"] == pairs["test"] == set(TRAIN_PAIRS)
    assert set(sample_scenes(PRETRAIN_SPLITS, 30000, seed=4)) == set(train) | set(test)


def test_balanced_scenes_take_turns_and_cover_the_split() -> None:
    scenes_ = balanced_scenes("test", 256, seed=1234)
    assert [s.kind for s in scenes_[:8]] == list(KINDS) * 2
    assert all(scene_split(s) == "test" for s in scenes_)
    singles = [s for s in scenes_ if s.kind == "single"]
    assert set(singles) == {s for s in enumerate_scenes("test") if s.kind == "single"}  # all before repeats
    assert balanced_scenes("test", 256, seed=1234) == scenes_ != balanced_scenes("test", 256, seed=1)


def test_enumeration_matches_sampling() -> None:
    every = {split: set(enumerate_scenes(split)) for split in SPLITS}
    assert not every["train"] & every["novel"] and not every["test"] & every["novel"]
    assert sum(len(v) for v in every.values()) == 18 * 3 + 18 * 17 * 5
    for split in SPLITS:
        assert set(sample_scenes(split, 2000, seed=3)) <= every[split]


def test_vocabulary_and_lengths() -> None:
    vocab = set(vocabulary())
    assert set(COLOUR_NAMES) | set(SHAPES) <= vocab
    lengths = []
    for split in SPLITS:
        scenes_ = enumerate_scenes(split)
        assert all(set(s.text.split()) <= vocab for s in scenes_)
        lengths += [len(s.text.split()) for s in scenes_]
    assert max(lengths) == max_prompt_words()
    assert vocab == {w for split in SPLITS for s in enumerate_scenes(split) for w in s.text.split()}


def test_sampling_is_deterministic() -> None:
    assert sample_scenes("train", 50, seed=5) == sample_scenes("train", 50, seed=5)
    assert sample_scenes("train", 50, seed=5) != sample_scenes("train", 50, seed=6)
    assert {s.kind for s in sample_scenes("train", 8, seed=0, kinds=("count",))} == {"count"}
    with pytest.raises(ValueError):
        sample_scenes("heldout", 1, seed=0)
    with pytest.raises(ValueError):
        sample_scenes(("train", "novel"), 1, seed=0)


# ---------------------------------------------------------------- renderer


def test_render_is_deterministic() -> None:
    sc = sample_scenes("train", 20, seed=4)
    a, b = render_batch(sc, seed=9), render_batch(sc, seed=9)
    assert a.shape == (20, 32, 32, 3) and a.dtype == np.uint8
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, render_batch(sc, seed=10))
    one = render(sc[0], np.random.default_rng(3))
    np.testing.assert_array_equal(one, render(sc[0], np.random.default_rng(3)))
    assert render(sc[0], np.random.default_rng(3), size=48).shape == (48, 48, 3)


@pytest.mark.parametrize(("size", "lattice"), [(32, Lattice(4)), (64, Lattice(4)), (32, Lattice(8, (1, 1)))])
def test_lattice_layout_puts_objects_on_cells(size: int, lattice: Lattice) -> None:
    cell = lattice.cell * size / 32
    widths = [k * cell for k in range(lattice.cells[0], lattice.cells[1] + 1)]
    rng = np.random.default_rng(5)
    for scene in sample_scenes("train", 300, seed=6):
        placed = layout(scene, rng, size, lattice)
        boxes = [box for _, _, box in placed]
        for x0, y0, w, h in boxes:
            assert x0 % cell == 0 and y0 % cell == 0 and w == h and w in widths
            assert x0 >= 0 and y0 >= 0 and x0 + w <= size and y0 + h <= size
        for i, a in enumerate(boxes):  # at least one empty cell between any two objects
            for b in boxes[i + 1 :]:
                apart_x = a[0] + a[2] + cell <= b[0] or b[0] + b[2] + cell <= a[0]
                assert apart_x or a[1] + a[3] + cell <= b[1] or b[1] + b[3] + cell <= a[1]
        if scene.relation is not None:
            rel = scene.relation
            assert relation_holds(rel.relation, boxes[rel.subject], boxes[rel.object], 3.0 * size / 32)


@pytest.mark.parametrize("lattice", [Lattice(4), Lattice(8, (1, 1))])
@pytest.mark.parametrize("split", SPLITS)
def test_lattice_ground_truth_is_verified(split: str, lattice: Lattice) -> None:
    sc = sample_scenes(split, 300, seed=30)
    scores, strict = score_batch(render_batch(sc, seed=31, lattice=lattice), sc)
    assert strict.mean() >= 0.99 and scores.mean() >= 0.995


def test_backgrounds_are_far_from_object_colours() -> None:
    rng = np.random.default_rng(0)
    protos = np.asarray(list(COLOURS.values()), dtype=np.float32)
    for _ in range(200):
        bg = np.clip(background(rng), 0, 255).reshape(-1, 1, 3)
        assert np.linalg.norm(bg - protos[None], axis=-1).min() > 120


# ---------------------------------------------------------------- verifier


@pytest.mark.parametrize("split", SPLITS)
def test_ground_truth_is_verified(split: str, ground_truth: dict) -> None:
    sc, images = ground_truth[split]
    scores, strict = score_batch(images, sc)
    assert strict.mean() >= 0.99
    assert scores.mean() >= 0.995


@pytest.mark.parametrize("split", SPLITS)
def test_verifier_survives_mild_blur_and_noise(split: str, ground_truth: dict) -> None:
    sc, images = ground_truth[split]
    rng = np.random.default_rng(7)
    noisy = gaussian_blur(images, sigma=0.7) / 255.0 + rng.normal(0.0, 0.03, images.shape)
    channels_first = torch.from_numpy(noisy.astype(np.float32)).permute(0, 3, 1, 2)  # unclipped model output
    _, strict = score_batch(channels_first, sc)
    assert strict.mean() >= 0.97


@pytest.mark.parametrize("split", SPLITS)
def test_mismatched_prompts_score_low(split: str, ground_truth: dict) -> None:
    sc, images = ground_truth[split]
    others = sample_scenes(split, N_EVAL, seed=999)
    keep = [i for i in range(N_EVAL) if others[i].text != sc[i].text]
    scores, strict = score_batch(images[keep], [others[i] for i in keep])
    assert strict.mean() <= 0.05
    assert scores.mean() <= 0.2


def test_wrong_relation_count_and_shape_fail() -> None:
    rel = sample_scenes("train", 200, seed=8, kinds=("relation",))
    images = render_batch(rel, seed=8)
    opposite = {"left of": "right of", "right of": "left of", "above": "below", "below": "above"}
    across = {"left of": "above", "right of": "below", "above": "right of", "below": "left of"}
    for swap in (opposite, across):
        wrong = [Scene(s.groups, Relation(0, swap[s.relation.relation], 1)) for s in rel]
        scores, strict = score_batch(images, wrong)
        assert strict.max() == 0
        assert np.allclose(scores, 4 / 5)  # only the relation fails
    counted = sample_scenes("novel", 200, seed=9, kinds=("count",))
    images = render_batch(counted, seed=9)
    other_count = [Scene((ObjectGroup(*s.groups[0].pair, 5 - s.groups[0].count),)) for s in counted]
    assert score_batch(images, other_count)[1].max() == 0
    singles = sample_scenes("train", 200, seed=10, kinds=("single",))
    images = render_batch(singles, seed=10)
    shapes = [
        Scene((ObjectGroup(s.groups[0].colour, SHAPES[(SHAPES.index(s.groups[0].shape) + 1) % 3]),)) for s in singles
    ]
    scores, strict = score_batch(images, shapes)
    assert strict.max() == 0 and np.allclose(scores, 0.0)  # the right colour in another shape earns nothing


def test_verdict_details_and_degenerate_images() -> None:
    scene = parse("two red circles")
    image = render(scene, np.random.default_rng(0))
    verdict = verify(image, scene)
    assert verdict.strict == 1 and verdict.score == 1.0
    assert [(d.colour, d.shape) for d in verdict.detections] == [("red", "circle")] * 2
    assert [name for name, _ in verdict.constraints] == ["red circle present", "red circle count == 2"]
    assert verdict.extra == 0
    assert verify(image / 255.0, scene).strict == 1  # float HxWx3 in [0, 1]
    assert verify(np.moveaxis(image, -1, 0) / 255.0, scene).strict == 1  # 3xHxW
    blank = np.full((32, 32, 3), 128, dtype=np.uint8)
    assert detect(blank) == []
    assert verify(blank, scene).strict == 0 and verify(blank, scene).score == 0.0
    flooded = np.zeros((32, 32, 3), dtype=np.uint8)
    flooded[..., 0] = 230
    assert verify(flooded, parse("a red square")).strict == 0  # a whole red image is no square


def test_score_batch_formats_agree() -> None:
    sc = sample_scenes("novel", 40, seed=11)
    images = render_batch(sc, seed=11)
    s1, t1 = score_batch(images, sc)
    s2, t2 = score_batch(torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255.0, sc)
    np.testing.assert_allclose(s1, s2)
    np.testing.assert_array_equal(t1, t2)
    assert s1.dtype == np.float32 and set(np.unique(t1)) <= {0.0, 1.0}
    with pytest.raises(ValueError):
        score_batch(images[:3], sc)


# ---------------------------------------------------------------- clutter never pays


def _mosaic(rng: np.random.Generator, block: int, size: int = 32) -> np.ndarray:
    """Blocks of random world colours (or grey) on grey."""
    protos = np.asarray(list(COLOURS.values()), dtype=np.uint8)
    n = size // block
    index = rng.integers(-1, len(protos), size=(n, n))
    img = np.full((n, n, 3), 128, dtype=np.uint8)
    img[index >= 0] = protos[index[index >= 0]]
    return img.repeat(block, 0).repeat(block, 1)


def _with_clutter(image: np.ndarray, scene: Scene, rng: np.random.Generator, lattice: Lattice) -> np.ndarray:
    """``image`` plus three objects of colour-shape pairs the prompt does not name, on free cells."""
    out = image.copy()
    named = {g.pair for g in scene.groups}
    others = [p for p in TRAIN_PAIRS if p not in named]
    cell = int(lattice.cell)
    bg = np.median(out.reshape(-1, 3), axis=0)  # the flat background
    cells = [(x, y) for y in range(0, 32, cell) for x in range(0, 32, cell)]
    free = [(x, y) for x, y in cells if (out[y : y + cell, x : x + cell] == bg).all()]
    assert len(free) >= 3
    for k in rng.permutation(len(free))[:3]:
        colour, shape = others[int(rng.integers(len(others)))]
        x, y = free[int(k)]
        alpha = coverage(shape, (x + 1.0, y + 1.0, cell - 2.0, cell - 2.0), 32)[:, :, None]
        out = np.rint(out * (1 - alpha) + np.asarray(COLOURS[colour]) * alpha).astype(np.uint8)
    return out


def test_adversarial_images_score_below_the_clean_rendering() -> None:
    """Colour mosaics, every colour at once and the prompt's objects plus clutter all score below the clean
    image, and the mosaics and floods below any base model worth training (0.1)."""
    lattice = Lattice(8, (1, 1))
    sc = balanced_scenes("test", 128, seed=5)
    clean = render_batch(sc, seed=6, lattice=lattice, flat=(45.0, 190.0))
    clean_scores, _ = score_batch(clean, sc)
    rng = np.random.default_rng(7)
    stripes = np.full((32, 32, 3), 128, dtype=np.uint8)
    for i, rgb in enumerate(COLOURS.values()):
        stripes[:, i * 5 : i * 5 + 5] = rgb
    attacks = {
        "mosaic 2 px": np.stack([_mosaic(rng, 2) for _ in sc]),
        "mosaic 4 px": np.stack([_mosaic(rng, 4) for _ in sc]),
        "mosaic 8 px": np.stack([_mosaic(rng, 8) for _ in sc]),
        "every colour": np.stack([stripes] * len(sc)),
    }
    for name, images in attacks.items():
        scores, strict = score_batch(images, sc)
        assert scores.mean() < 0.1 and strict.max() == 0, name
    cluttered = np.stack([_with_clutter(img, s, rng, lattice) for img, s in zip(clean, sc, strict=True)])
    scores, strict = score_batch(cluttered, sc)
    assert strict.max() == 0
    assert (scores < clean_scores).all()  # three extra objects cancel three met constraints


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 5), st.integers(1, 12), st.integers(1, 12), st.integers(0, 2**31 - 1))
def test_batched_component_labels_equal_one_image_at_a_time(b: int, h: int, w: int, seed: int) -> None:
    """verify_batch labels every image's components in one batched pass: the same labels as image by image,
    and the same as a plain flood fill (smallest flat index of each 8-connected same-colour component)."""
    from flowrl.world.verify import label_components

    maps = np.random.default_rng(seed).integers(-1, 3, size=(b, h, w)).astype(np.int8)
    batched = label_components(maps)
    for k in range(b):
        single = label_components(maps[k])
        assert np.array_equal(batched[k], single)
        expected = np.full((h, w), -1)
        for y in range(h):
            for x in range(w):
                if maps[k, y, x] < 0 or expected[y, x] >= 0:
                    continue
                colour, stack, members = maps[k, y, x], [(y, x)], []
                expected[y, x] = 0
                while stack:
                    cy, cx = stack.pop()
                    members.append(cy * w + cx)
                    for dy in (-1, 0, 1):
                        for dx in (-1, 0, 1):
                            ny, nx = cy + dy, cx + dx
                            if 0 <= ny < h and 0 <= nx < w and expected[ny, nx] < 0 and maps[k, ny, nx] == colour:
                                expected[ny, nx] = 0
                                stack.append((ny, nx))
                for m in members:
                    expected[m // w, m % w] = min(members)
        assert np.array_equal(single, expected)


def test_batched_verdicts_equal_one_image_at_a_time() -> None:
    """verify_batch analyses the whole batch at once (colour maps, each image's own background chroma, its
    components): every verdict equals the verdict of its image verified alone, on images with different
    tinted, noisy backgrounds and blurred objects, where each image's background estimate differs."""
    sc = sample_scenes("train", 24, seed=5)
    images = render_batch(sc, seed=9).astype(np.float32) / 255.0
    rng = np.random.default_rng(3)
    tint = rng.uniform(-0.08, 0.08, size=(len(sc), 1, 1, 3)).astype(np.float32)
    images = images + tint + rng.normal(0.0, 0.05, size=images.shape).astype(np.float32)
    images = np.clip((images + np.roll(images, 1, axis=1) + np.roll(images, 1, axis=2)) / 3.0, 0.0, 1.0)
    asked = sc[:12] + sc[12:][::-1]  # half the images checked against another image's prompt
    batched = verify_batch(np.moveaxis(images, -1, 1), asked)
    alone = [verify(image, scene) for image, scene in zip(images, asked, strict=True)]
    assert batched == alone
    assert len({v.score for v in alone}) > 2  # verdicts of several kinds


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 4), st.integers(1, 9), st.integers(0, 2**31 - 1))
def test_batched_background_medians_equal_numpy_median(b: int, side: int, seed: int) -> None:
    """Each image's background chroma comes from one sort of the whole batch: equal to numpy's median over
    that image's background pixels (even and odd counts, and zero for an image with no background)."""
    import importlib

    verify_module = importlib.import_module("flowrl.world.verify")
    rng = np.random.default_rng(seed)
    chroma = rng.normal(0.0, 30.0, size=(b, side, side, 3)).astype(np.float32)
    cmaps = rng.integers(-1, 2, size=(b, side, side)).astype(np.int8)
    cmaps[0] = 0  # the first image is all object
    got = verify_module._background_medians(chroma, cmaps)
    for k in range(b):
        background = chroma[k][cmaps[k] < 0]
        expected = np.median(background, axis=0) if len(background) else np.zeros(3, dtype=np.float32)
        np.testing.assert_allclose(got[k], expected, rtol=1e-6, atol=1e-4)
