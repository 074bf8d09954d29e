"""HPSv2 through hpsv2's own model code on a tiny open_clip config and checkpoint (tests/data/rewards/hps/)."""

from __future__ import annotations

import os

import pytest

if os.environ.get("FLOWRL_EXTRAS") != "1":  # set by `nox -s extras`; the main environment lacks these packages
    pytest.skip("needs the extras environment (nox -s extras)", allow_module_level=True)

import json
from pathlib import Path

import numpy as np
import torch
from conftest import SCORE_TOL
from PIL import Image

from flowrl.core.registry import build
from flowrl.rewards.base import RewardConfigError
from flowrl.rewards.hps import ensure_vocab
from flowrl.rewards.preprocess import ImagePreprocess

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "rewards"
GOLDEN = json.loads((DATA / "golden.json").read_text())
PROMPTS = GOLDEN["prompts"]
SPEC = {
    "type": "hpsv2",
    "checkpoint": str(DATA / "hps" / "tiny_hps.pt"),
    "model": "tiny-hps",
    "model_config": str(DATA / "hps" / "tiny-hps.json"),
    "device": "cpu",
}


def pil() -> Image.Image:
    return Image.open(DATA / "image.png").convert("RGB")


def batch() -> torch.Tensor:
    array = np.asarray(pil(), dtype=np.float32) / 255.0
    return torch.from_numpy(array).permute(2, 0, 1).unsqueeze(0).repeat(len(PROMPTS), 1, 1, 1)


def test_golden_hps_score() -> None:
    reward = build("reward", SPEC)
    reward.check()
    scores = reward.score(batch(), list(PROMPTS))
    assert scores.shape == (len(PROMPTS),) and scores.dtype == torch.float32
    np.testing.assert_allclose(scores.numpy(), GOLDEN["hpsv2"], **SCORE_TOL)  # recorded on another machine
    single = build("reward", {**SPEC, "batch_size": 1}).score(batch(), list(PROMPTS))
    torch.testing.assert_close(scores, single, **SCORE_TOL)  # other batch shapes: not bitwise


def _reference():
    """hpsv2's img_score recipe: create_model_and_transforms, the checkpoint's state_dict, preprocess_val."""
    ensure_vocab()
    from hpsv2.src.open_clip import add_model_config, create_model_and_transforms, get_tokenizer

    add_model_config(SPEC["model_config"])
    model, _, preprocess_val = create_model_and_transforms(
        "tiny-hps", None, precision="amp", device="cpu", output_dict=True, light_augmentation=True
    )
    model.load_state_dict(torch.load(SPEC["checkpoint"], map_location="cpu")["state_dict"])
    return model.eval(), preprocess_val, get_tokenizer("tiny-hps")


def test_preprocessing_matches_preprocess_val() -> None:
    _, preprocess_val, _ = _reference()
    expected = preprocess_val(pil()).unsqueeze(0)
    ours = ImagePreprocess(fit="pad", backend="torch")(batch()[:1])
    assert ours.shape == expected.shape == (1, 3, 224, 224)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=0)


def test_score_equals_hpsv2_img_score_recipe() -> None:
    model, preprocess_val, tokenizer = _reference()
    with torch.no_grad():
        image = preprocess_val(pil()).unsqueeze(0)
        expected = []
        for prompt in PROMPTS:
            out = model(image, tokenizer([prompt]))
            expected.append(torch.diagonal(out["image_features"] @ out["text_features"].T)[0])
    ours = build("reward", SPEC).score(batch(), list(PROMPTS))
    # bounded by the preprocessing (ours vs preprocess_val: 1e-5 per pixel, above) more than by the batching
    # (a batch of 2 here, one image at a time there: ~1e-7 on these cosines)
    torch.testing.assert_close(ours, torch.stack(expected), atol=1e-5, rtol=0)


def test_check_names_the_missing_checkpoint(tmp_path: Path) -> None:
    missing = str(tmp_path / "HPS_v2.1_compressed.pt")
    with pytest.raises(RewardConfigError) as info:
        build("reward", {"type": "hpsv2", "checkpoint": missing}).check()
    assert str(info.value) == f"reward 'hpsv2': weights not found at {missing} (set reward.checkpoint)"
    with pytest.raises(RewardConfigError, match=r"no weights configured \(set reward.checkpoint"):
        build("reward", {"type": "hpsv2"}).check()


def test_a_checkpoint_of_another_model_is_one_clear_error() -> None:
    with pytest.raises(RewardConfigError, match="does not fit model 'ViT-B-32'"):
        build("reward", {**SPEC, "model": "ViT-B-32"}).score(batch(), list(PROMPTS))
