"""The Qwen-Image-Edit base (flowrl/backbones/qwen_image/edit.py): its deterministic ODE sample is diffusers'
QwenImageEditPipeline (one source) and QwenImageEditPlusPipeline (two sources; with and without ``zero_cond_t``)
on the same prompts, sources, initial latents and steps, with true CFG (the negative read with the same sources),
and the check fails when the sources' tokens are dropped; text prompts and wrong image counts are refused; the
``qwen_image_edit`` loader reads a saved folder and refuses, at recipe load, a resolution or a pipeline the saved
model cannot take; the conformance rules hold with source images; LoRA targets and AEGPO's probe (target rows)."""

from __future__ import annotations

import math
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import torch
from conftest import ROOT, tiny_recipe
from PIL import Image

import flowrl
from flowrl.backbones.qwen_image.tiny import TinyQwenImageEditSpec, save_tiny_qwen_image_edit
from flowrl.config.recipe import RecipeError, recipe_from_dict
from flowrl.conformance import check_backbone
from flowrl.core.conditions import Condition, Prompt
from flowrl.core.registry import registry
from flowrl.core.types import Conditioning, Plan, Schedule
from flowrl.parts.samplers.walk import walk

TEXTS = ["a red circle", "two blue squares"]
SETTINGS = {"type": "tiny_qwen_image_edit", "resolution": 32}
PLUS = {**SETTINGS, "pipeline": "edit_plus", "images": 2, "vision_resolution": 16}


def _sources(n: int, seed: int = 0, size: int = 32) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in range(n)]


def _prompts(images: list[np.ndarray], per_prompt: int = 1) -> list[str]:
    groups = [images[i : i + per_prompt] for i in range(0, len(images), per_prompt)]
    return [Prompt(t, [Condition(i) for i in g]) for t, g in zip(TEXTS, groups, strict=True)]


def _ode(backbone: flowrl.Backbone, cond: Conditioning, x1: torch.Tensor, steps: int) -> torch.Tensor:
    schedule = Schedule(backbone.schedule_sigmas(steps, 3.0), flowrl.build("kernel", {"type": "ode"}))
    with torch.no_grad():
        return walk(backbone, x1, cond, torch.arange(x1.shape[0]), 0, Plan((), ()), schedule, None)


def _pipeline(backbone: Any, images: Any, texts: list[str], x1: torch.Tensor, steps: int, monkeypatch: Any) -> Any:
    """The pipeline's own ``__call__`` at the base's sizes: its areas (Edit: 1024**2 for the VAE and the vision
    copy; Edit-Plus: 1024**2 and 384**2) set to the squares of ``resolution`` and ``vision_resolution``, so that a
    square source is read at the sides flowrl reads it (its rounding to 32 aside, the pipeline's own rule)."""
    import diffusers.pipelines.qwenimage.pipeline_qwenimage_edit as edit
    import diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus as plus

    res, side = backbone.config.resolution, backbone.vision_side
    if backbone.config.pipeline == "edit":
        monkeypatch.setattr(edit, "calculate_dimensions", lambda area, ratio: (res, res, None))
    else:
        monkeypatch.setattr(plus, "calculate_dimensions", lambda area, ratio: (math.isqrt(area), math.isqrt(area)))
        monkeypatch.setattr(plus, "VAE_IMAGE_SIZE", res * res)
        monkeypatch.setattr(plus, "CONDITION_IMAGE_SIZE", side * side)
    guided = backbone.config.true_cfg_scale > 1
    with torch.no_grad():
        return backbone.pipe(
            image=images,
            prompt=texts,
            negative_prompt=[backbone.config.negative_prompt] * len(texts) if guided else None,
            true_cfg_scale=backbone.config.true_cfg_scale,
            latents=x1.clone(),
            num_inference_steps=steps,
            height=res,
            width=res,
            output_type="latent",
        ).images


def _pil(images: list[np.ndarray]) -> list[Image.Image]:
    return [Image.fromarray(i) for i in images]


@pytest.mark.parametrize("true_cfg_scale", [1.0, 4.0])
def test_ode_sample_equals_qwen_image_edit_pipeline(true_cfg_scale: float, monkeypatch: Any) -> None:
    backbone = flowrl.build("backbone", {**SETTINGS, "true_cfg_scale": true_cfg_scale})
    assert type(backbone.pipe).__name__ == "QwenImageEditPipeline"
    images, steps = _sources(2), 4
    x1 = backbone.noise(2, torch.Generator().manual_seed(1))
    cond = backbone.encode(_prompts(images))
    assert cond.tensors["source"].shape == x1.shape  # the source's tokens: as many as the target's
    ours = _ode(backbone, cond, x1, steps)
    theirs = _pipeline(backbone, _pil(images), TEXTS, x1, steps, monkeypatch)
    assert ours.shape == theirs.shape == (2, 16, 16)
    # The same float32 modules on the same inputs; what differs is the batch layout of the VAE encode (flowrl one
    # source at a time, the pipeline both at once), of the text encoder (flowrl one prompt at a time, no padding)
    # and the padding of the text rows (flowrl pads to a fixed length under a mask). Measured gap: 2.4e-7 unguided,
    # 8.6e-7 guided, on latents of up to ~3.95, a few float32 ulps of that magnitude. The tolerance, 1e-5 of the
    # latents' largest magnitude (~4e-5), is ~45x the larger gap and far below the source's effect (next checks).
    scale = float(theirs.abs().max())
    assert (ours - theirs).abs().max() <= 1e-5 * scale
    assert ours.std() > 0.1
    # the check can fail: without the source's VAE tokens the sample moves away ...
    empty = Conditioning({**cond.tensors, "source": cond.tensors["source"][:, :0]})
    monkeypatch.setattr(type(backbone), "source_shapes", property(lambda self: []))
    assert (_ode(backbone, empty, x1, steps) - theirs).abs().max() > 100 * 1e-5 * scale
    monkeypatch.undo()
    # ... and another source image gives another sample (its VAE tokens and its vision tokens differ)
    other = _ode(backbone, backbone.encode(_prompts(_sources(2, seed=7))), x1, steps)
    assert (other - theirs).abs().max() > 100 * 1e-5 * scale


@pytest.mark.parametrize("zero_cond_t", [False, True])
def test_ode_sample_equals_qwen_image_edit_plus_pipeline(zero_cond_t: bool, monkeypatch: Any) -> None:
    """Two sources per prompt, read by the vision encoder at 16 px and by the VAE at 32 px; the pipeline takes one
    prompt a call (Edit-Plus refuses a batch), flowrl the batch."""
    backbone = flowrl.build("backbone", {**PLUS, "zero_cond_t": zero_cond_t})
    assert type(backbone.pipe).__name__ == "QwenImageEditPlusPipeline"
    assert backbone.transformer.config.zero_cond_t is zero_cond_t
    images, steps = _sources(4), 3
    x1 = backbone.noise(2, torch.Generator().manual_seed(2))
    cond = backbone.encode(_prompts(images, per_prompt=2))
    assert cond.tensors["source"].shape == (2, 32, 16)  # both sources' tokens, one after the other
    ours = _ode(backbone, cond, x1, steps)
    theirs = torch.cat([_pipeline(backbone, _pil(images[2 * i : 2 * i + 2]), [TEXTS[i]], x1[i : i + 1], steps,
                                  monkeypatch) for i in range(2)])  # fmt: skip
    scale = float(theirs.abs().max())
    # as above: measured gap 9.5e-7 (8.3e-7 with zero_cond_t) on latents of up to ~3.24; tolerance 1e-5 of that
    assert (ours - theirs).abs().max() <= 1e-5 * scale
    swapped = [Prompt(p.text, p.conditions[::-1]) for p in _prompts(images, per_prompt=2)]  # order matters
    assert (_ode(backbone, backbone.encode(swapped), x1, steps) - theirs).abs().max() > 100 * 1e-5 * scale


@pytest.mark.parametrize("settings", [SETTINGS, PLUS], ids=["edit", "edit_plus"])
def test_text_rows_start_at_the_sources_vision_tokens(settings: dict[str, Any], capsys: Any) -> None:
    """The edit tokenizer cuts the template's system message into the 64 tokens the pipelines drop, so a row is
    the sources' vision tokens (Edit-Plus: after "Picture k:"), the instruction, the template's 5 closing tokens;
    the negative prompt is read with each prompt's own sources."""
    from flowrl.backbones.qwen_image.tokenizer import template_prefix_length

    backbone = flowrl.build("backbone", settings)
    pipe = backbone.pipe
    assert template_prefix_length(pipe.tokenizer, pipe.prompt_template_encode) == 64
    assert pipe.prompt_template_encode_start_idx == 64 and "warning" not in capsys.readouterr().err
    n = backbone.config.images
    vision = (backbone.vision_side // 8) ** 2  # one vision token per 8 x 8 pixels (4-pixel patches merged 2 x 2)
    per_image = vision + 2 + (3 if settings is PLUS else 0)  # <|vision_start|> ... <|vision_end|>, "picture k :"
    prompts = _prompts(_sources(2 * n), per_prompt=n)
    cond = backbone.encode(prompts)
    assert cond.tensors["mask"].sum(1).tolist() == [n * per_image + 3 + 5] * 2  # both instructions are 3 words
    assert backbone.text_capacity() == n * per_image + 5 + backbone.config.max_sequence_length
    neg = cond.tensors["neg_embeds"]
    # " " makes no token with the word tokenizer (it drops spaces; Qwen2's BPE makes one)
    assert cond.tensors["neg_mask"].sum(1).tolist() == [n * per_image + 5] * 2
    assert not torch.allclose(neg[0], neg[1])  # read with different sources


def test_prompts_need_their_sources() -> None:
    backbone = flowrl.build("backbone", SETTINGS)
    with pytest.raises(ValueError, match=r"takes exactly 1 source image\(s\) per prompt; 'a cat' has 0"):
        backbone.encode(["a cat"])
    with pytest.raises(ValueError, match="has 2"):
        backbone.encode([Prompt("a cat", [Condition(i) for i in _sources(2)])])
    spec = type(backbone).accepts(backbone.config)
    assert spec.count == (1, 1) and spec.problem([]) is not None
    plus = registry("backbone").get("tiny_qwen_image_edit").Config(**{k: v for k, v in PLUS.items() if k != "type"})
    assert type(backbone).accepts(plus).describe() == "exactly 2 images (source 1, source 2)"
    big = np.repeat(np.repeat(_sources(1)[0], 2, axis=0), 3, axis=1)  # 64 x 96: short side 64 -> 32, crop 48 -> 32
    row = backbone.encode([Prompt("a cat", [Condition(big)])]).tensors["source"]
    assert row.shape == (1, 16, 16) and torch.isfinite(row).all()


def test_recipe_load_refuses_settings_no_model_takes(tmp_path: Any) -> None:
    data = tiny_recipe()
    data["backbone"] = {**SETTINGS, "images": 2}
    with pytest.raises(RecipeError, match=r"\[backbone.images\] QwenImageEditPipeline takes one source image"):
        recipe_from_dict(data)
    save_tiny_qwen_image_edit(TinyQwenImageEditSpec(image_size=32), tmp_path / "edit")
    settings = {"type": "qwen_image_edit", "path": str(tmp_path / "edit"), "dtype": "float32"}
    data["backbone"] = {**settings, "resolution": 36}
    with pytest.raises(RecipeError, match=r"\[backbone.resolution\] 36 must be a multiple of 8 for the model in"):
        recipe_from_dict(data)
    data["backbone"] = {**settings, "resolution": 32, "pipeline": "edit_plus"}
    with pytest.raises(RecipeError, match=r"\[backbone.pipeline\] 'edit_plus' does not fit .* set pipeline = 'edit'"):
        recipe_from_dict(data)
    data["backbone"] = {**settings, "resolution": 32}
    assert recipe_from_dict(data).parts["backbone"].config.resolution == 32


def test_qwen_image_edit_loads_a_saved_pipeline(tmp_path: Any) -> None:
    save_tiny_qwen_image_edit(TinyQwenImageEditSpec(image_size=32), tmp_path / "edit")
    settings = {"path": str(tmp_path / "edit"), "resolution": 32, "max_sequence_length": 32, "dtype": "float32",
                "vision_resolution": 32}  # fmt: skip
    loaded = flowrl.build("backbone", {"type": "qwen_image_edit", **settings})
    twin = flowrl.build("backbone", SETTINGS)
    prompts = _prompts(_sources(2))
    x = twin.noise(2, torch.Generator().manual_seed(3))
    s = torch.tensor([0.9, 0.3])
    with torch.no_grad():
        v_loaded = loaded.velocity(x, s, loaded.encode(prompts))
        v_twin = twin.velocity(x, s, twin.encode(prompts))
    assert torch.allclose(v_loaded, v_twin, atol=1e-6)


def test_conforms_with_source_images() -> None:
    check_backbone(lambda: flowrl.build("backbone", {**SETTINGS, "resolution": 16}), _prompts(_sources(2, size=16)))


def test_qwen_lora_targets_attach_to_the_edit_transformer() -> None:
    from flowrl.backbones.lora.targets import lora_target_problems
    from flowrl.config.settings import LoraConfig
    from flowrl.trainer.lora import add_lora

    settings = {**SETTINGS, "resolution": 16}
    recipe = recipe_from_dict({**tiny_recipe(), "backbone": settings, "lora": {"rank": 2}})
    assert "img_mlp.net.2" in recipe.lora.target_modules  # Qwen-Image's, from the backbone
    assert list(lora_target_problems(recipe)) == []
    backbone = flowrl.build("backbone", settings)
    add_lora(backbone.transformer, LoraConfig(rank=2, alpha=2.0, target_modules=recipe.lora.target_modules))
    trained = [n for n, p in backbone.transformer.named_parameters() if p.requires_grad]
    assert trained and all("lora_" in n for n in trained)
    x = backbone.noise(2, torch.Generator().manual_seed(4))
    v = backbone.velocity(x, torch.tensor([0.8, 0.4]), backbone.encode(_prompts(_sources(2, size=16))))
    v.square().sum().backward()
    # every adapter has a gradient, but the last block's text-stream outputs' (their output is never read)
    missing = [n for n, p in backbone.transformer.named_parameters() if p.requires_grad and p.grad is None]
    last = f"transformer_blocks.{len(backbone.transformer.transformer_blocks) - 1}."
    assert all(n.startswith(last) and ("txt_mlp" in n or "to_add_out" in n) for n in missing), missing
    assert len(missing) < len(trained) // 4


def test_probe_measures_the_target_rows_only() -> None:
    """AEGPO's probe: the velocity unchanged, and the entropy of the target's query rows (the source's tokens are
    keys, not measured rows): it equals the probe restricted to those rows and differs from every image row's."""
    from flowrl.backbones.common.probe import EntropyRecorder
    from flowrl.backbones.common.probe_options import AttentionEntropyOptions
    from flowrl.backbones.qwen_image.probe import entropy_probe

    backbone = flowrl.build("backbone", {**SETTINGS, "resolution": 16, "true_cfg_scale": 1.0})
    x = backbone.noise(2, torch.Generator().manual_seed(5))
    s = torch.tensor([0.9, 0.5])
    cond = backbone.encode(_prompts(_sources(2, size=16)))
    options = AttentionEntropyOptions()
    with torch.no_grad():
        v, entropy = backbone.velocity_and_entropy(x, s, cond, options)
        assert torch.equal(v, backbone.velocity(x, s, cond))
        measured = {}
        for rows in (x.shape[1], None):
            recorder = EntropyRecorder()
            with entropy_probe(backbone.module, options, recorder, rows):
                backbone.velocity(x, s, cond)
            measured[rows] = recorder.entropy()
    assert entropy.shape == (2,) and torch.isfinite(entropy).all() and (entropy >= 0).all()
    assert torch.allclose(entropy, measured[x.shape[1]], atol=1e-6)
    assert not torch.allclose(entropy, measured[None], atol=1e-4)


SMOKE = ROOT / "recipes" / "smoke" / "qwen_image_edit.toml"


def test_smoke_recipe_validates() -> None:
    command = [sys.executable, "-m", "flowrl.cli.main", "validate", str(SMOKE)]
    out = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.slow
def test_smoke_recipe_trains_two_iterations(tmp_path: Any) -> None:
    """Both rewards on the edit prompts: JPEG on the result alone, the world's verifier against the source."""
    from flowrl.config.recipe import load_recipe
    from flowrl.trainer.loop import Trainer

    trainer = Trainer(load_recipe(SMOKE), tmp_path, quiet=True)
    try:
        for _ in range(2):
            metrics = trainer.iteration()
            assert math.isfinite(metrics["loss"]) and metrics["nfe"] > 0
            assert math.isfinite(metrics["reward/jpeg_compressibility"])
            assert 0.0 <= metrics["reward/world_edit_verifier"] <= 1.0
    finally:
        trainer.logger.close()
        trainer.release()
