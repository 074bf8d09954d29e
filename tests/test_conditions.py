"""Conditions in the data model: the Prompt type, condition images, the JSONL prompt file and the check against
what a base takes (flowrl.core.conditions, flowrl.parts.prompts)."""

from __future__ import annotations

import json
import operator
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from flowrl.backbones.common.prompt_cache import cached_encodings
from flowrl.backbones.common.vocabulary import UnknownWords
from flowrl.core.conditions import (
    TEXT_ONLY,
    Condition,
    ConditionError,
    ConditionSpec,
    Prompt,
    check_conditions,
    conditions_of,
    fit_square,
)
from flowrl.core.errors import UserError
from flowrl.parts.prompts import PromptFileError, PromptJsonl, PromptList


def image(seed: int, size: int = 8, mode: str = "RGB") -> np.ndarray:
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    return np.random.default_rng(seed).integers(0, 256, (size, size, channels), dtype=np.uint8)


def cond(seed: int, **kwargs: object) -> Condition:
    return Condition(image(seed), **kwargs)  # type: ignore[arg-type]


# ---------------------------------------------------------------- the Prompt type


def test_a_prompt_without_conditions_is_the_plain_string() -> None:
    p = Prompt("a red circle")
    assert type(p) is str and p == "a red circle"
    assert conditions_of(p) == () and conditions_of("a red circle") == ()


def test_prompts_are_equal_by_text_and_condition_contents() -> None:
    a, a_again, b = (
        Prompt("make it red", [cond(0)]),
        Prompt("make it red", [Condition(image(0))]),
        Prompt("make it red", [cond(1)]),
    )
    assert a == a_again and hash(a) == hash(a_again) and operator.ne(a, a_again) is False
    assert a != b and a != "make it red" and operator.ne("make it red", a) and operator.eq(a, "make it red") is False
    assert len({a, a_again, b, "make it red"}) == 3
    assert {a: 1}[a_again] == 1
    assert conditions_of(a) == (cond(0),) and a.text == "make it red" and type(a.text) is str
    assert str(a) == "make it red" and type(str(a)) is str and f"{a}" == "make it red"
    assert a.split() == ["make", "it", "red"] and a.upper() == "MAKE IT RED"
    assert json.dumps([a]) == '["make it red"]'


def test_prompts_pickle_with_their_conditions() -> None:
    a = Prompt("make it red", [cond(0), cond(1)])
    back = pickle.loads(pickle.dumps(a))
    assert back == a and conditions_of(back) == conditions_of(a)
    np.testing.assert_array_equal(conditions_of(back)[1].pixels, image(1))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(-1, 3)), min_size=1, max_size=12))
def test_the_order_of_a_batch_never_changes_a_cached_encoding(items: list[tuple[str, int]]) -> None:
    """The backbone's cache encodes what a batch lacks in sorted order: with conditions, the same set of prompts in
    any order is encoded in the same order, and each (text, images) is encoded once, apart from the same text."""
    prompts = [Prompt(t, [] if k < 0 else [cond(k)]) for t, k in items]
    calls: list[list[str]] = []

    def encode(batch: list[str]) -> list[tuple[str, tuple[str, ...]]]:
        calls.append(batch)
        return [(str(p), tuple(c.key for c in conditions_of(p))) for p in batch]

    rows = cached_encodings({}, UnknownWords(None), prompts, encode)
    assert rows == [(str(p), tuple(c.key for c in conditions_of(p))) for p in prompts]
    again: list[list[str]] = []
    cached_encodings({}, UnknownWords(None), prompts[::-1], lambda b: again.append(b) or encode(b))
    assert again[0] == calls[0]  # the same order whatever the batch's
    assert len(calls[0]) == len(set(prompts))


def test_condition_checks_its_pixels_and_keeps_them_read_only() -> None:
    c = cond(3, origin="x.png")
    assert c.size == (8, 8) and c.mode == "RGB" and c.pixels.shape == (8, 8, 3)
    with pytest.raises(ValueError):
        c.pixels[0, 0, 0] = 1
    assert c.tensor().shape == (3, 8, 8) and float(c.tensor().max()) <= 1.0
    assert Condition(image(0, mode="L")[:, :, 0], mode="L").pixels.shape == (8, 8, 1)
    with pytest.raises(ValueError):
        Condition(image(0).astype(np.float32))
    with pytest.raises(ValueError):
        Condition(image(0), mode="RGBA")
    with pytest.raises(TypeError):
        Prompt("x", [image(0)])  # type: ignore[list-item]


def test_fit_square_scales_the_short_side_and_crops_the_centre() -> None:
    c = Condition(np.zeros((16, 32, 3), np.uint8))
    assert fit_square(c, 8).shape == (3, 8, 8)
    same = cond(5)
    assert torch.equal(fit_square(same, 8), same.tensor())


# ---------------------------------------------------------------- what a base takes


def test_specs_describe_and_refuse() -> None:
    edit = ConditionSpec(count=(1, 1), meaning=("the source image",))
    assert TEXT_ONLY.problem([]) is None and edit.problem([cond(0)]) is None
    assert TEXT_ONLY.problem([cond(0)]) == "has 1 image; the base takes none (a text-to-image base)"
    assert edit.problem([]) == "has no image; the base takes exactly 1 image (the source image)"
    assert ConditionSpec(count=(1, 3)).problem([cond(0)] * 4) == "has 4 images; the base takes 1 to 3 images"
    rgba = Condition(image(0, mode="RGBA"), mode="RGBA", origin="a.png")
    assert edit.problem([rgba]) == "image a.png is RGBA; the base takes RGB images (drop the alpha channel)"
    with pytest.raises(ConditionError, match=r"^f, record 2: has no image; the backbone 'edit' takes exactly 1"):
        check_conditions([("f, record 1:", Prompt("x", [cond(0)])), ("f, record 2:", "y")], edit, "edit")


def test_the_default_source_check_covers_the_heldout_prompts() -> None:
    source = PromptList(PromptList.Config(prompts=("a",), heldout=("b", "c")))
    assert [w for w, _ in source.condition_records()] == [
        "[prompts] held-out prompt 1 ('b'):",
        "[prompts] held-out prompt 2 ('c'):",
    ]


# ---------------------------------------------------------------- the JSONL prompt file


def save(path: Path, pixels: np.ndarray, mode: str = "RGB") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels if mode != "L" else pixels[:, :, 0], mode).save(path)


def write_jsonl(path: Path, records: list[object]) -> None:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in records) + "\n")


def test_jsonl_prompts_carry_their_images_relative_to_the_file(tmp_path: Path) -> None:
    data = tmp_path / "data"
    save(data / "img" / "0.png", image(0))
    save(data / "img" / "1.png", image(1))
    write_jsonl(
        data / "train.jsonl",
        [
            {"prompt": "make the red circle green", "image": "img/0.png", "source_caption": "ignored"},
            "",
            {"prompt": " two references ", "images": ["img/0.png", "img/1.png"]},
            {"prompt": "a text-to-image record"},
        ],
    )
    write_jsonl(data / "test.jsonl", [{"prompt": "remove it", "images": ["img/1.png"]}])
    source = PromptJsonl(PromptJsonl.Config(path=str(data / "train.jsonl"), heldout_path=str(data / "test.jsonl")))
    first, second, third = source.prompts
    assert first == Prompt("make the red circle green", [Condition(image(0))])
    assert [c.origin for c in conditions_of(second)] == [str(data / "img" / "0.png"), str(data / "img" / "1.png")]
    assert second.text == "two references" and type(third) is str
    np.testing.assert_array_equal(conditions_of(source.heldout()[0])[0].pixels, image(1))
    drawn = source.sample(16, torch.Generator().manual_seed(0))
    assert set(drawn) <= set(source.prompts)
    records = [w for w, _ in source.condition_records()]
    assert records[1] == f"[prompts.path] prompt file {data / 'train.jsonl'}, record 2 (line 3):"
    assert records[3] == f"[prompts.heldout_path] prompt file {data / 'test.jsonl'}, record 1 (line 1):"


def test_a_file_backed_image_is_read_again_and_must_not_change(tmp_path: Path) -> None:
    save(tmp_path / "a.png", image(0))
    c = Condition.from_file(tmp_path / "a.png", "here")
    assert c._pixels is None and c == Condition(image(0))
    np.testing.assert_array_equal(c.pixels, image(0))
    save(tmp_path / "a.png", image(1))
    with pytest.raises(ConditionError, match="changed since it was checked"):
        c.pixels  # noqa: B018


@pytest.mark.parametrize(
    ("records", "files", "message"),
    [
        (['{"prompt": "x", '], {}, "record 1 (line 1): not JSON (Expecting property name enclosed in double quotes,"),
        (['["x"]'], {}, 'record 1 (line 1): expected an object with a non-empty "prompt" string, got ["x"]'),
        ([{"image": "a.png"}], {}, 'expected an object with a non-empty "prompt" string'),
        ([{"prompt": "x"}, {"prompt": "  "}], {}, 'record 2 (line 2): expected an object with a non-empty "prompt"'),
        ([{"prompt": "x", "image": "a.png", "images": []}], {}, 'give "image" (one path) or "images" (a list)'),
        ([{"prompt": "x", "images": "a.png"}], {}, '"image" is a path and "images" a list of paths'),
        ([{"prompt": "x", "image": "nope.png"}], {}, "record 1 (line 1): image nope.png: no such file"),
        ([{"prompt": "x", "image": "a.png"}], {"a.png": b"not an image"}, "image a.png: not an image PIL can read"),
        ([{"prompt": "x", "image": "a.png"}], {"a.png": "truncated"}, "image a.png: cannot read it"),
        ([{"prompt": "x", "image": "a.jpg"}], {"a.jpg": "CMYK"}, "image a.jpg: mode CMYK, which flowrl does not take"),
        ([{"prompt": "x", "image": "img"}], {"img/b.png": "RGB"}, "image img: a folder, not an image file"),
        (["", "  "], {}, "no records (the file is empty)"),
    ],
)
def test_bad_jsonl_files_stop_with_one_line_naming_the_file_and_record(
    tmp_path: Path, records: list, files: dict, message: str
) -> None:
    for name, content in files.items():
        if isinstance(content, bytes):
            (tmp_path / name).write_bytes(content)
        elif content == "truncated":
            save(tmp_path / name, image(0, size=64))
            (tmp_path / name).write_bytes((tmp_path / name).read_bytes()[:200])
        else:
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            Image.new(content, (8, 8)).save(tmp_path / name)
    path = tmp_path / "p.jsonl"
    write_jsonl(path, records)
    with pytest.raises(UserError) as caught:
        PromptJsonl(PromptJsonl.Config(path=str(path)))
    text = str(caught.value)
    assert text.startswith(f"[prompts.path] prompt file {path}") and message in text, text
    assert "\n" not in text and isinstance(caught.value, (PromptFileError, ConditionError))
