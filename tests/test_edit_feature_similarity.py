"""The ``edit_feature_similarity`` reward on a tiny random-weight DINOv2 (transformers' ``Dinov2Model``, built and
saved here with a DINOv2-style processor config, no download): its features equal transformers' own processor and
model, identical images score 1, a changed region scores less, and a prompt without a source is refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import flowrl
from flowrl.core.conditions import Condition, Prompt, fit_square
from flowrl.rewards.feature_preservation import EditFeatureSimilarity

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def tiny_dinov2(folder: Path) -> str:
    """A tiny random DINOv2 (width 32, 2 layers, patch 8 at 32 px) and a processor config in DINOv2's layout
    (shortest side 40, centre crop 32: the release's 256 / 224 scaled down)."""
    from transformers import BitImageProcessorPil, Dinov2Config, Dinov2Model

    torch.manual_seed(0)
    config = Dinov2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                          patch_size=8, image_size=32)
    Dinov2Model(config).eval().save_pretrained(folder)
    BitImageProcessorPil(size={"shortest_edge": 40}, crop_size={"height": 32, "width": 32}, image_mean=IMAGENET_MEAN,
                         image_std=IMAGENET_STD).save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return tiny_dinov2(tmp_path_factory.mktemp("dinov2") / "model")


def edits(count: int = 3) -> tuple[torch.Tensor, list[str]]:
    """Results equal to their 48 x 40 sources brought to a 32 px square, and the prompts carrying the sources."""
    rng = np.random.default_rng(0)
    conditions = [Condition(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)) for _ in range(count)]
    return torch.stack([fit_square(c, 32) for c in conditions]), [Prompt("recolour it", [c]) for c in conditions]


def test_the_features_are_transformers_own(model: str) -> None:
    from PIL import Image
    from transformers import AutoImageProcessor, AutoModel

    reward = flowrl.build("reward", {"type": "edit_feature_similarity", "model": model, "device": "cpu"})
    results, prompts = edits()
    changed = results.flip(-1)
    got = reward.score(changed, prompts)
    processor, net = AutoImageProcessor.from_pretrained(model), AutoModel.from_pretrained(model).eval()

    def embed(images: torch.Tensor) -> torch.Tensor:
        pil = [Image.fromarray((i.permute(1, 2, 0) * 255).round().byte().numpy()) for i in images]
        with torch.no_grad():
            out = net(**processor(images=pil, return_tensors="pt")).pooler_output
        return torch.nn.functional.normalize(out, dim=-1)

    expected = (embed(changed) * embed(results)).sum(-1)
    assert expected.max() < 0.999  # the flip moves the features: not a comparison of ones
    # the same uint8 pixels through the same float32 network: only summation order differs (~1e-7 on unit vectors)
    assert torch.allclose(got, expected, rtol=0, atol=1e-5), (got, expected)


def test_identical_is_one_and_a_changed_region_is_less(model: str) -> None:
    reward = EditFeatureSimilarity(EditFeatureSimilarity.Config(model=model, device="cpu"))
    results, prompts = edits()
    same = reward.score(results, prompts)
    assert torch.allclose(same, torch.ones(3), rtol=0, atol=1e-6)  # cos of a unit vector with itself, float32
    patched = results.clone()
    patched[:, :, 8:24, 8:24] = 1 - patched[:, :, 8:24, 8:24]
    assert (reward.score(patched, prompts) < 1 - 1e-4).all()
    with pytest.raises(ValueError, match="'recolour it' has none"):
        reward.score(results[:1], ["recolour it"])
    assert EditFeatureSimilarity.needs_conditions(EditFeatureSimilarity.Config())
