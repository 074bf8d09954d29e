"""Video clips: which frames a frame reward scores, the reward of a clip (the mean over its frames, or the whole
clip for a video reward), the recipe's ``[[reward]] frames``, the stills and animations written for clips."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_recipe
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

import flowrl
from flowrl.config.recipe import RecipeError, recipe_from_dict
from flowrl.report.page import _png
from flowrl.report.samples import sample_table
from flowrl.rewards.frames import eval_pictures, score_pictures
from flowrl.trainer.logger import image_grid, save_grid_animation, write_grid
from flowrl.utils.video import as_stills, frame_choice_problem, frame_indices, write_animation


@given(st.integers(1, 200), st.integers(1, 40))
def test_a_count_chooses_evenly_spaced_frames_with_both_ends(num_frames: int, count: int) -> None:
    chosen = frame_indices(num_frames, count)
    assert chosen == sorted(set(chosen)) and all(0 <= f < num_frames for f in chosen)
    assert len(chosen) == min(count, num_frames)
    if count >= 2 and num_frames >= 2:
        assert chosen[0] == 0 and chosen[-1] == num_frames - 1
        gaps = [b - a for a, b in zip(chosen, chosen[1:], strict=False)]
        assert max(gaps) - min(gaps) <= 1  # evenly spaced up to rounding


def test_lists_all_and_the_default() -> None:
    assert frame_indices(33, [0, 16, 32]) == [0, 16, 32]
    assert frame_indices(5, "all") == [0, 1, 2, 3, 4]
    assert frame_indices(33) == frame_indices(33, 8) and len(frame_indices(33)) == 8
    assert frame_indices(3, 1) == [1]  # one frame: the middle one
    with pytest.raises(ValueError, match=r"frames \[9\] do not exist in a clip of 5 frames"):
        frame_indices(5, [0, 9])


@pytest.mark.parametrize(
    ("value", "why"),
    [(0, "positive"), (-2, "positive"), ([], "non-empty"), ([1, 1], "distinct"), ([0, -1], "non-negative"),
     ("some", "all"), (True, "positive count"), (1.5, "positive count")],
)
def test_bad_frame_choices_are_named(value: object, why: str) -> None:
    problem = frame_choice_problem(value)
    assert problem is not None and why in problem
    assert all(frame_choice_problem(good) is None for good in (4, [0, 3], "all", None))


def _clips(b: int = 3, f: int = 5, side: int = 16) -> torch.Tensor:
    return torch.rand(b, f, 3, side, side, generator=torch.Generator().manual_seed(0))


def test_an_image_reward_scores_a_clip_as_the_mean_over_its_chosen_frames() -> None:
    reward = flowrl.build("reward", {"type": "jpeg_compressibility"})
    clips, prompts = _clips(), ["a red circle", "a cat", "two dogs"]
    reward.frames = [0, 2, 4]
    got = score_pictures(reward, clips, prompts)
    # each frame alone, then the mean: the per-image score of this reward does not depend on its batch
    per_frame = torch.stack([reward.score(clips[:, f], prompts) for f in (0, 2, 4)], dim=1)
    assert got.shape == (3,)
    torch.testing.assert_close(got, per_frame.mean(1), rtol=1e-6, atol=0)
    images = clips[:, 0]
    assert torch.equal(score_pictures(reward, images, prompts), reward.score(images, prompts))  # images pass through
    figures = eval_pictures(reward, clips, prompts)
    assert figures["score"] == pytest.approx(float(per_frame.mean()), rel=1e-6)


def test_a_video_reward_gets_the_whole_clip() -> None:
    jpeg = flowrl.registry("reward").get("jpeg_compressibility")
    seen: list[tuple[int, ...]] = []

    class ClipLength(jpeg):  # type: ignore[misc, valid-type]
        video = True

        def score(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
            seen.append(tuple(images.shape))
            return images.flatten(1).mean(1)

    clips = _clips(2, 7)
    out = score_pictures(ClipLength(ClipLength.Config()), clips, ["a", "b"])
    assert seen == [(2, 7, 3, 16, 16)] and torch.equal(out, clips.flatten(1).mean(1))


def test_the_recipe_sets_frames_and_names_a_bad_value() -> None:
    data = tiny_recipe()
    data["reward"] = [{"type": "jpeg_compressibility", "frames": [0, 4]}]
    recipe = recipe_from_dict(data)
    assert recipe.rewards[0].frames == (0, 4) and recipe.rewards[0].build().frames == (0, 4)
    assert recipe.rewards[0].to_table()["frames"] == [0, 4]
    assert recipe_from_dict(tiny_recipe()).rewards[0].build().frames is None
    data["reward"] = [{"type": "jpeg_compressibility", "frames": 0}]
    with pytest.raises(RecipeError, match=r"\[reward.frames\] a frame count must be positive"):
        recipe_from_dict(data)


def test_clips_become_stills_and_animations(tmp_path: Path) -> None:
    clips = _clips(2, 6, side=8)
    stills = as_stills(clips, frames=3)
    assert stills.shape == (2, 3, 8, 24)
    assert torch.equal(stills[0, :, :, 8:16], clips[0, frame_indices(6, 3)[1]])  # the second still is frame 2 or 3
    assert image_grid(clips, rows=1).shape == (3, 8, 2 * 6 * 8)  # every frame of each clip, two clips in a row
    gapped = image_grid(clips, rows=1, gap=2)  # a white gutter between the two clips
    assert gapped.shape == (3, 8, 2 * 6 * 8 + 2) and bool((gapped[:, :, 48:50] == 1).all())
    for suffix in (".webp", ".gif"):
        path = tmp_path / f"clip{suffix}"
        write_animation(clips[0], path)
        with Image.open(path) as image:
            assert image.is_animated and image.n_frames == 6 and image.size == (8, 8)
    webp = tmp_path / "lossless.webp"
    write_animation(clips[1], webp)
    with Image.open(webp) as image:  # lossless: the first frame comes back exactly as its 8-bit pixels
        first = torch.from_numpy(np.array(image.convert("RGB"))).permute(2, 0, 1)
    assert torch.equal(first, (clips[1, 0] * 255).round().to(torch.uint8))
    with pytest.raises(ValueError, match="not '.png'"):
        write_animation(clips[0], tmp_path / "x.png")
    save_grid_animation(clips, rows=2, path=tmp_path / "grid.gif", scale=1)
    with Image.open(tmp_path / "grid.gif") as image:
        assert image.n_frames == 6 and image.size == (8, 17)  # a pixel of gutter between the two rows


def test_held_out_clips_are_written_and_shown_animated(tmp_path: Path) -> None:
    clips = _clips(2, 4, side=8)
    write_grid((clips, ["a cat", "a dog"]), tmp_path / "samples" / "step_3.png")
    assert (tmp_path / "samples" / "step_3.webp").is_file()
    html = "\n".join(sample_table(tmp_path, _png))  # one animated tile per clip, captioned by its prompt
    assert html.count("<img") == 2 and html.count("data:image/webp;base64,") == 2 and "image/png" not in html
    assert '<th class="prompt">a cat</th>' in html and 'alt="a dog at iteration 3"' in html
    write_grid((clips[:, 0], ["a cat", "a dog"]), tmp_path / "images" / "samples" / "step_3.png")  # a PNG only
    assert not (tmp_path / "images" / "samples" / "step_3.webp").exists()
    html = "\n".join(sample_table(tmp_path / "images", _png))
    assert html.count("data:image/png;base64,") == 2 and "image/webp" not in html


def test_rollout_health_measures_clips_over_every_frame() -> None:
    from flowrl.trainer.health import rollout_health

    clips = _clips(4, 3, side=8)
    group, advantages = torch.tensor([0, 0, 1, 1]), torch.tensor([1.0, -1.0, 0.0, 0.0])
    as_images = rollout_health(clips.flatten(1, 2), group, advantages)  # frames as channels: the same pixels
    assert rollout_health(clips, group, advantages) == as_images and as_images["health/zero_spread"] == 0.5
