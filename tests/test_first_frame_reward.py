"""The first-frame consistency reward (flowrl/rewards/first_frame.py): 1 for a clip whose first frame is its input,
lower as the frame moves away, later frames ignored, the condition fitted to the frame size, both metrics (pixel;
CLIP embeddings from the tiny test CLIP), the refusals; and frame-averaged image rewards on image-to-video clips."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_recipe

import flowrl
from flowrl.config.condition_checks import reward_condition_problems
from flowrl.config.recipe import recipe_from_dict
from flowrl.core.conditions import Condition, Prompt, fit_frame
from flowrl.rewards.frames import score_pictures

CLIP = str(Path(__file__).parent / "data" / "rewards" / "clip")


def _images(n: int, h: int, w: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for _ in range(n)]


def _clips(firsts: list[np.ndarray], frames: int = 5, seed: int = 1) -> torch.Tensor:
    """Clips ``(B, F, 3, H, W)`` whose first frames are ``firsts`` and whose later frames are random."""
    first = torch.stack([Condition(f).tensor() for f in firsts])
    rest = torch.rand((len(firsts), frames - 1, *first.shape[1:]), generator=torch.Generator().manual_seed(seed))
    return torch.cat([first[:, None], rest], dim=1)


def test_pixel_score_is_one_for_the_input_and_falls_with_distance() -> None:
    reward = flowrl.build("reward", {"type": "first_frame_consistency"})
    assert reward.video and type(reward).needs_conditions(reward.config)
    images = _images(3, 16, 24)
    prompts = [Prompt(f"clip {i}", [Condition(im)]) for i, im in enumerate(images)]
    clips = _clips(images)
    assert torch.equal(reward.score(clips, prompts), torch.ones(3))  # exact: the same uint8 / 255 on both sides
    assert torch.equal(reward.score(_clips(images, seed=9), prompts), torch.ones(3))  # later frames do not count
    inverted = clips.clone()
    inverted[:, 0] = 1 - inverted[:, 0]
    expected = 1 - (1 - 2 * clips[:, 0]).abs().mean((1, 2, 3))
    assert torch.allclose(reward.score(inverted, prompts), expected, atol=1e-6)
    noisy = [clips.clone() for _ in range(2)]
    for k, std in enumerate((0.05, 0.2)):
        noise = torch.randn(clips[:, 0].shape, generator=torch.Generator().manual_seed(k)) * std
        noisy[k][:, 0] = (clips[:, 0] + noise).clamp(0, 1)
    near, far = (reward.score(c, prompts) for c in noisy)
    assert (far < near).all() and (near < 1).all()
    # an image batch is read as the first frames; the scale and offset apply
    assert torch.equal(reward.score(clips[:, 0], prompts), torch.ones(3))
    shifted = flowrl.build("reward", {"type": "first_frame_consistency", "offset": 0.5, "scale": 2.0})
    assert torch.equal(shifted.score(clips, prompts), torch.ones(3))


def test_the_condition_is_fitted_to_the_frame_size() -> None:
    reward = flowrl.build("reward", {"type": "first_frame_consistency"})
    big = _images(1, 32, 64)[0]
    prompt = Prompt("a wide frame", [Condition(big)])
    frame = fit_frame(Condition(big), 24, 16)  # cover 24 x 16 (scale 0.5: 32 x 16), crop the centre
    assert frame.shape == (3, 16, 24)
    assert torch.equal(reward.score(frame[None, None], [prompt]), torch.ones(1))


def test_prompts_without_a_first_frame_are_refused() -> None:
    reward = flowrl.build("reward", {"type": "first_frame_consistency"})
    with pytest.raises(ValueError, match="has no condition image"):
        reward.score(torch.rand(1, 2, 3, 8, 8), ["a cat"])
    grey = Prompt("a grey cat", [Condition(np.zeros((8, 8), dtype=np.uint8), "L")])
    with pytest.raises(ValueError, match="has a L image"):
        reward.score(torch.rand(1, 2, 3, 8, 8), [grey])
    data = tiny_recipe()  # text prompts: refused by `flowrl validate` and `flowrl train`, before any model loads
    data["reward"] = [{"type": "first_frame_consistency"}]
    problems = reward_condition_problems(recipe_from_dict(data))
    assert problems and "'first_frame_consistency' needs each prompt's condition images" in problems[0][1]


def test_clip_metric_on_the_tiny_test_clip() -> None:
    reward = flowrl.build("reward", {"type": "first_frame_consistency", "metric": "clip", "model": CLIP,
                                     "device": "cpu"})
    reward.check()
    images = _images(2, 32, 32)
    prompts = [Prompt(f"clip {i}", [Condition(im)]) for i, im in enumerate(images)]
    same = reward.score(_clips(images), prompts)
    swapped = reward.score(_clips(images[::-1]), prompts)
    # the same picture on both sides: cosine 1 up to float32 rounding in the embedding (|e| = 1, 8 dimensions)
    assert torch.allclose(same, torch.ones(2), atol=1e-5)
    assert (swapped < same - 1e-3).all()
    missing = flowrl.build("reward", {"type": "first_frame_consistency", "metric": "clip", "model": "/no/such/clip"})
    with pytest.raises(Exception, match="reward.model"):
        missing.check()
    flowrl.build("reward", {"type": "first_frame_consistency", "model": "/no/such/clip"}).check()  # pixel: no model


def test_frame_averaged_image_rewards_score_image_to_video_clips() -> None:
    """An image reward scores an I2V clip as the mean over its chosen frames, the prompts keeping their first
    frames; the first-frame reward (a video reward) gets the whole clip."""
    backbone = flowrl.build("backbone", {"type": "tiny_wan_i2v", "variant": "2.2-a14b", "resolution": 16,
                                         "num_frames": 9})
    images = _images(2, 16, 16)
    prompts = [Prompt(t, [Condition(im)]) for t, im in zip(("a red circle", "a cat"), images, strict=True)]
    x = backbone.noise(2, torch.Generator().manual_seed(0))
    clips = backbone.decode(x)
    assert clips.shape == (2, 9, 3, 16, 16)
    jpeg = flowrl.build("reward", {"type": "jpeg_compressibility", "scale_kb": 1.0})
    jpeg.frames = "all"
    per_frame = torch.stack([jpeg.score(clips[:, f], list(prompts)) for f in range(9)], dim=1).mean(1)
    assert torch.allclose(score_pictures(jpeg, clips, prompts), per_frame, atol=1e-6)
    first = flowrl.build("reward", {"type": "first_frame_consistency"})
    assert torch.equal(score_pictures(first, clips, prompts), first.score(clips[:, :1].squeeze(1), prompts))
