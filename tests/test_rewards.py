"""Model-based rewards in the main environment: golden scores on tiny local weights (the real code path),
preprocessing against the reference processor, start-up checks, the OCR text match.

The weights and the recorded scores in tests/data/rewards/ come from scripts/make_tiny_reward_weights.py.
ImageReward has its own file (tests/test_imagereward.py); HPSv2 and the real OCR engine need the extras:
tests/extras (``nox -s extras``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, SCORE_TOL, tiny_recipe
from PIL import Image

from flowrl.config.tomlwrite import dumps
from flowrl.core.registry import build
from flowrl.rewards.base import RewardConfigError, has_module, resolve_device
from flowrl.rewards.clip_rewards import linear_stack
from flowrl.rewards.ocr import levenshtein, quoted_text, text_match
from flowrl.rewards.preprocess import ImagePreprocess, resized_shape

DATA = ROOT / "tests" / "data" / "rewards"
CLIP = str(DATA / "clip")
GOLDEN = json.loads((DATA / "golden.json").read_text())
PROMPTS = GOLDEN["prompts"]


def image() -> torch.Tensor:
    array = np.asarray(Image.open(DATA / "image.png").convert("RGB"), dtype=np.float32) / 255.0
    return torch.from_numpy(array).permute(2, 0, 1).unsqueeze(0)


def batch() -> torch.Tensor:
    return image().repeat(len(PROMPTS), 1, 1, 1)


SPECS = {
    "pickscore": {"type": "pickscore", "model": CLIP, "processor": CLIP, "device": "cpu"},
    "clipscore": {"type": "clipscore", "model": CLIP, "device": "cpu"},
    "aesthetic": {"type": "aesthetic", "model": CLIP, "head": str(DATA / "aesthetic_head.pth"), "device": "cpu"},
}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_golden_scores_on_tiny_weights(name: str) -> None:
    reward = build("reward", SPECS[name])
    reward.check()
    scores = reward.score(batch(), list(PROMPTS))
    assert scores.dtype == torch.float32 and scores.shape == (len(PROMPTS),)
    np.testing.assert_allclose(scores.numpy(), GOLDEN[name], **SCORE_TOL)  # recorded on another machine


def test_scores_do_not_depend_on_batching_and_rescale() -> None:
    whole = build("reward", SPECS["pickscore"]).score(batch(), list(PROMPTS))
    one_by_one = build("reward", {**SPECS["pickscore"], "batch_size": 1}).score(batch(), list(PROMPTS))
    torch.testing.assert_close(whole, one_by_one, **SCORE_TOL)  # other batch shapes: not bitwise
    rescaled = build("reward", {**SPECS["pickscore"], "offset": 18.0, "scale": 0.125}).score(batch(), list(PROMPTS))
    torch.testing.assert_close(rescaled, (whole - 18.0) * 0.125)


def _reference_processor():  # transformers' PIL-backed CLIP processor (no torchvision here)
    import transformers

    cls = getattr(transformers, "CLIPImageProcessorPil", None) or transformers.CLIPImageProcessor
    return cls.from_pretrained(CLIP)


def test_pil_preprocessing_matches_the_clip_processor() -> None:
    reference = _reference_processor()
    pil = Image.open(DATA / "image.png").convert("RGB")
    expected = torch.as_tensor(np.asarray(reference(images=[pil], return_tensors="np")["pixel_values"]))
    ours = ImagePreprocess(backend="pil")(image())
    assert ours.shape == expected.shape == (1, 3, 224, 224)
    # the same PIL resize, then an elementwise normalisation (numpy there, torch here) of values in [-1.8, 2.2]:
    # a few float32 ulps (~2e-7) at most on any machine (0 measured)
    torch.testing.assert_close(ours, expected.float(), atol=1e-5, rtol=0)
    on_device = ImagePreprocess(backend="torch")(image())  # the on-device resize is close, not identical
    assert (on_device - ours).abs().mean() < 0.02


def test_pickscore_equals_the_reference_recipe() -> None:
    """PickScore's own recipe: processor -> get_image/text_features -> normalise -> logit_scale.exp() * dot."""
    from transformers import AutoTokenizer, CLIPModel

    model = CLIPModel.from_pretrained(CLIP).eval()
    tokenizer = AutoTokenizer.from_pretrained(CLIP)
    pil = Image.open(DATA / "image.png").convert("RGB")
    pixels = torch.as_tensor(np.asarray(_reference_processor()(images=[pil] * 2, return_tensors="np")["pixel_values"]))
    tokens = tokenizer(list(PROMPTS), padding=True, truncation=True, max_length=77, return_tensors="pt")
    with torch.no_grad():
        img = model.get_image_features(pixel_values=pixels.float())
        txt = model.get_text_features(**tokens)
    img = getattr(img, "pooler_output", img)  # transformers 5 returns an output object
    txt = getattr(txt, "pooler_output", txt)
    img, txt = img / img.norm(dim=-1, keepdim=True), txt / txt.norm(dim=-1, keepdim=True)
    expected = model.logit_scale.exp() * (img * txt).sum(-1)
    ours = build("reward", SPECS["pickscore"]).score(batch(), list(PROMPTS))
    torch.testing.assert_close(ours, expected, **SCORE_TOL)


def test_aesthetic_head_formats() -> None:
    torch.manual_seed(0)
    plain = torch.nn.Linear(8, 1)  # LAION's first (linear) predictor: weight and bias only
    layers = linear_stack(plain.state_dict())
    assert len(layers) == 1 and layers[0][0].shape == (1, 8)
    stacked = linear_stack(torch.load(DATA / "aesthetic_head.pth", weights_only=True))
    assert [tuple(w.shape) for w, _ in stacked] == [(16, 8), (8, 16), (4, 8), (2, 4), (1, 2)]
    with pytest.raises(ValueError, match="chain"):
        linear_stack({"layers.0.weight": torch.zeros(4, 8), "layers.1.weight": torch.zeros(1, 3)})


def test_preprocess_shapes() -> None:
    assert resized_shape(48, 64, 224, "crop") == (224, 298)
    assert resized_shape(48, 64, 224, "pad") == (168, 224)
    padded = ImagePreprocess(fit="pad", backend="torch", mean=(0.0,) * 3, std=(1.0,) * 3)(image())
    assert padded.shape == (1, 3, 224, 224)
    assert padded[..., :28, :].abs().max() == 0 and padded[..., 28:196, :].abs().max() > 0  # centred, zero pad


def test_device_setting() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto", torch.zeros(1)).type == expected


# -- start-up checks: one line naming the path or the extra --------------------------------------------------
def _check_message(spec: dict) -> str:
    with pytest.raises(RewardConfigError) as info:
        build("reward", spec).check()
    message = str(info.value)
    assert "\n" not in message
    return message


def test_check_names_the_missing_path(tmp_path: Path) -> None:
    missing = str(tmp_path / "PickScore_v1")
    message = _check_message({"type": "pickscore", "model": missing, "processor": CLIP})
    assert message == f"reward 'pickscore': weights not found at {missing} (set reward.model)"
    head = str(tmp_path / "sac+logos+ava1-l14-linearMSE.pth")
    message = _check_message({"type": "aesthetic", "model": CLIP, "head": head})
    assert message == f"reward 'aesthetic': aesthetic head not found at {head} (set reward.head)"
    assert "set reward.head" in _check_message({"type": "aesthetic", "model": CLIP})


def test_check_refuses_a_hub_id_offline_unless_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    import flowrl.rewards.base as base

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(base, "_in_hub_cache", lambda repo_id: False)
    message = _check_message({"type": "clipscore"})
    assert "'openai/clip-vit-large-patch14' is not a local folder and the hub is offline" in message
    assert "set reward.model" in message
    monkeypatch.setattr(base, "_in_hub_cache", lambda repo_id: True)  # in the local Hugging Face cache: fine
    build("reward", {"type": "clipscore"}).check()
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # online: the hub id is left to from_pretrained
    monkeypatch.setattr(base, "_in_hub_cache", lambda repo_id: False)
    build("reward", {"type": "clipscore"}).check()


@pytest.mark.skipif(has_module("hpsv2"), reason="hpsv2 is installed here")
def test_check_names_the_hps_extra(tmp_path: Path) -> None:
    message = _check_message({"type": "hpsv2", "checkpoint": str(tmp_path / "HPS_v2.1_compressed.pt")})
    assert message.startswith("reward 'hpsv2' needs the 'hps' extra")
    assert "pip install -e '.[hps]'" in message


@pytest.mark.skipif(has_module("rapidocr_onnxruntime"), reason="rapidocr is installed here")
def test_check_names_the_ocr_extra() -> None:
    message = _check_message({"type": "ocr"})
    assert message.startswith("reward 'ocr' needs the 'ocr' extra") and "pip install -e '.[ocr]'" in message


def test_missing_reward_weights_fail_before_the_backbone_loads(tmp_path: Path) -> None:
    """A recipe whose reward weights are absent exits 2 with one line before the (also absent) backbone loads."""
    recipe = tiny_recipe()
    recipe["backbone"] = {"type": "flux", "path": str(tmp_path / "no-flux-here")}
    weights = tmp_path / "sac+logos+ava1-l14-linearMSE.pth"
    recipe["reward"] = [
        {"type": "pickscore", "model": CLIP, "processor": CLIP},
        {"type": "aesthetic", "model": CLIP, "head": str(weights)},
    ]
    path = tmp_path / "recipe.toml"
    path.write_text(dumps(recipe))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "flowrl.cli.main", "train", str(path), "--output-dir", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=600,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert lines == [f"error: reward 'aesthetic': aesthetic head not found at {weights} (set reward.head)"], lines
    assert not (tmp_path / "run").exists()


# -- OCR: the text match (the engine itself runs in tests/extras) --------------------------------------------
def test_quoted_text_and_edit_distance() -> None:
    assert quoted_text('A neon sign that says "OPEN 24h" at night') == "OPEN 24h"
    assert quoted_text("a sign reading “Café”") == "Café"
    assert quoted_text("no quotes") is None
    assert levenshtein("kitten", "sitting") == 3 and levenshtein("", "abc") == 3 and levenshtein("abc", "abc") == 0


def test_text_match() -> None:
    assert text_match("Welcome! OPEN 24h today", "open 24h") == 1.0  # contained, case and spaces ignored
    assert text_match("OPFN", "OPEN") == pytest.approx(0.75)
    assert text_match("", "OPEN") == 0.0
    assert text_match("completely different words", "OPEN") == 0.0  # capped at the target's length
    assert text_match("OPEN", None) == 0.0 and text_match("OPEN", "  ") == 0.0
    assert text_match("open", "OPEN", case_sensitive=True) == 0.0


class _FakeEngine:
    """RapidOCR's call convention: (lines of [box, text, confidence] or None, timings)."""

    def __call__(self, image: np.ndarray) -> tuple:
        assert image.dtype == np.uint8 and image.shape[-1] == 3
        return [[None, "HELLO", 0.9], [None, "W0RLD", 0.2]], None


def test_ocr_reward_with_a_stub_engine() -> None:
    reward = build("reward", {"type": "ocr", "min_confidence": 0.5})
    reward._model = _FakeEngine()
    prompts = ['a poster saying "hello"', 'a poster saying "hello world"', "no quoted text"]
    scores = reward.score(torch.rand(3, 3, 16, 16), prompts)
    assert scores.tolist() == pytest.approx([1.0, 5 / 10, 0.0])
