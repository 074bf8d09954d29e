"""The FLUX.1-Kontext edit base (flowrl/backbones/flux/kontext.py): its deterministic ODE sample is diffusers'
FluxKontextPipeline on the same prompts, source images, initial latents, steps and sigmas (and the check fails
when the source tokens are dropped); text-only prompts run FLUX.1's forward; the ``flux_kontext`` loader reads a
saved folder; the conformance rules hold with source images; LoRA targets and AEGPO's probe on the Kontext
transformer."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import ROOT, tiny_recipe
from PIL import Image

import flowrl
from flowrl.backbones.common.tiny import save_pipeline
from flowrl.backbones.flux.tiny import TinyFluxSpec, tiny_flux_kontext_pipeline
from flowrl.config.recipe import RecipeError, recipe_from_dict
from flowrl.conformance import check_backbone
from flowrl.core.conditions import Condition, Prompt
from flowrl.core.types import Conditioning, Plan, Schedule
from flowrl.parts.samplers.walk import walk

TEXTS = ["a red circle", "two blue squares"]
SETTINGS = {"type": "tiny_flux_kontext", "resolution": 32}


def _sources(n: int, seed: int = 0, size: int = 32) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in range(n)]


def _prompts(images: list[np.ndarray]) -> list[str]:
    return [Prompt(t, [Condition(i)]) for t, i in zip(TEXTS, images, strict=True)]


def _ode(backbone: flowrl.Backbone, cond: Conditioning, x1: torch.Tensor, steps: int) -> torch.Tensor:
    schedule = Schedule(backbone.schedule_sigmas(steps, 3.0), flowrl.build("kernel", {"type": "ode"}))
    with torch.no_grad():
        return walk(backbone, x1, cond, torch.arange(x1.shape[0]), 0, Plan((), ()), schedule, None)


def _pipeline(backbone: flowrl.Backbone, images: list[np.ndarray] | None, x1: torch.Tensor, steps: int) -> torch.Tensor:
    """FluxKontextPipeline.__call__ at the base's size: max_area = resolution**2 and no snapping of the source to
    Kontext's preferred resolutions (flowrl's rule: the source is the base's resolution); flowrl's grid is the
    scheduler's static shift of the same linear sigmas."""
    res = backbone.config.resolution
    with torch.no_grad():
        return backbone.pipe(  # type: ignore[no-any-return]
            image=None if images is None else [Image.fromarray(i) for i in images],
            prompt=TEXTS,
            latents=x1.clone(),
            num_inference_steps=steps,
            sigmas=list(np.linspace(1.0, 1 / steps, steps)),
            height=res,
            width=res,
            max_area=res * res,
            _auto_resize=False,
            guidance_scale=backbone.config.guidance,
            max_sequence_length=backbone.config.max_sequence_length,
            output_type="latent",
        ).images


@pytest.mark.parametrize("steps", [3, 6])
def test_ode_sample_equals_flux_kontext_pipeline(steps: int) -> None:
    backbone = flowrl.build("backbone", SETTINGS)
    assert type(backbone.pipe).__name__ == "FluxKontextPipeline"
    assert backbone.transformer.config.guidance_embeds  # the guidance value reaches the model
    images = _sources(2)
    x1 = backbone.noise(2, torch.Generator().manual_seed(1))
    cond = backbone.encode(_prompts(images))
    assert cond.tensors["source"].shape == x1.shape  # the source's tokens: as many as the target's
    ours = _ode(backbone, cond, x1, steps)
    theirs = _pipeline(backbone, images, x1, steps)
    assert ours.shape == theirs.shape == (2, 64, 16)
    # Same float32 operations in the same order on the same tensors; what differs is how the source's pixels reach
    # [-1, 1] (flowrl: uint8 / 255 * 2 - 1; diffusers: its image processor) and the batch layout of the VAE encode
    # and of the text encoders. Measured gap: 9.5e-7 (3 steps) and 7.2e-7 (6 steps) on latents of up to ~4.1, a few
    # float32 ulps of that magnitude. The tolerance, 1e-5 of the latents' largest magnitude (~4.1e-5), is ~40x the
    # gap and ~1/1200 of the source's effect on this random twin (dropping its tokens moves the sample by ~0.049).
    scale = float(theirs.abs().max())
    assert (ours - theirs).abs().max() <= 1e-5 * scale
    assert ours.std() > 0.1
    # the check can fail: without the source's tokens (FLUX.1's text-to-image forward) the sample moves away
    text_only = Conditioning({k: v for k, v in cond.tensors.items() if k != "source"})
    dropped = _ode(backbone, text_only, x1, steps)
    assert (dropped - theirs).abs().max() > 100 * 1e-5 * scale
    # and another source image gives another sample
    other = _ode(backbone, backbone.encode(_prompts(_sources(2, seed=7))), x1, steps)
    assert (other - theirs).abs().max() > 100 * 1e-5 * scale


def test_text_prompts_run_the_pipeline_without_an_image() -> None:
    backbone = flowrl.build("backbone", SETTINGS)
    x1 = backbone.noise(2, torch.Generator().manual_seed(2))
    cond = backbone.encode(TEXTS)
    assert "source" not in cond.tensors
    ours, theirs = _ode(backbone, cond, x1, 3), _pipeline(backbone, None, x1, 3)
    assert (ours - theirs).abs().max() <= 1e-5 * float(theirs.abs().max())


def test_source_is_resized_and_cropped_to_the_resolution() -> None:
    """A source of another size is scaled so its short side is the resolution and centre-cropped (fit_square)."""
    backbone = flowrl.build("backbone", SETTINGS)
    big = np.repeat(np.repeat(_sources(1)[0], 2, axis=0), 3, axis=1)  # 64 x 96: short side 64 -> 32, crop 48 -> 32
    row = backbone.encode([Prompt("a cat", [Condition(big)])]).tensors["source"]
    assert row.shape == (1, 64, 16) and torch.isfinite(row).all()
    with pytest.raises(ValueError, match="mixes prompts"):
        backbone.encode(["a cat", Prompt("a dog", [Condition(_sources(1)[0])])])


def test_flux_kontext_loads_a_saved_pipeline(tmp_path) -> None:
    spec = TinyFluxSpec(pixel_space=False, guidance_embeds=True)
    save_pipeline(tiny_flux_kontext_pipeline(spec), tmp_path / "kontext")
    settings = {"path": str(tmp_path / "kontext"), "resolution": 32, "max_sequence_length": 16, "dtype": "float32"}
    loaded = flowrl.build("backbone", {"type": "flux_kontext", **settings, "guidance": 2.5})
    twin = flowrl.build("backbone", SETTINGS)
    prompts = _prompts(_sources(2))
    x = twin.noise(2, torch.Generator().manual_seed(3))
    s = torch.tensor([0.9, 0.3])
    with torch.no_grad():
        v_loaded = loaded.velocity(x, s, loaded.encode(prompts))
        v_twin = twin.velocity(x, s, twin.encode(prompts))
    assert torch.allclose(v_loaded, v_twin, atol=1e-6)
    with pytest.raises(ValueError, match="multiple of 4"):  # the tiny VAE halves once: 2 x 2 packing of 2 px cells
        flowrl.build("backbone", {"type": "flux_kontext", **settings, "resolution": 30})
    # the recipe loader refuses it first, in one line naming the key, before any model loads
    data = tiny_recipe()
    data["backbone"] = {"type": "flux_kontext", **settings, "resolution": 30}
    with pytest.raises(RecipeError, match=r"\[backbone.resolution\] 30 must be a multiple of 4 for the model in"):
        recipe_from_dict(data)
    data["backbone"]["resolution"] = 32
    assert recipe_from_dict(data).parts["backbone"].config.resolution == 32


def test_conforms_with_source_images() -> None:
    check_backbone(lambda: flowrl.build("backbone", {**SETTINGS, "resolution": 16}), _prompts(_sources(2, size=16)))


def test_flux_lora_targets_attach_to_the_kontext_transformer() -> None:
    from flowrl.backbones.lora.targets import lora_target_problems
    from flowrl.config.recipe import recipe_from_dict
    from flowrl.config.settings import LoraConfig
    from flowrl.trainer.lora import add_lora

    recipe = recipe_from_dict({**tiny_recipe(), "backbone": {**SETTINGS, "resolution": 16}, "lora": {"rank": 2}})
    assert recipe.lora.target_modules == ("to_q", "to_k", "to_v", "to_out.0")  # FLUX's, from the backbone
    assert list(lora_target_problems(recipe)) == []
    backbone = flowrl.build("backbone", {**SETTINGS, "resolution": 16})
    add_lora(backbone.transformer, LoraConfig(rank=2, alpha=2.0, target_modules=recipe.lora.target_modules))
    trained = [n for n, p in backbone.transformer.named_parameters() if p.requires_grad]
    blocks = ("transformer_blocks", "single_transformer_blocks")
    assert trained and all("lora_" in n for n in trained) and all(any(b in n for n in trained) for b in blocks)
    x = backbone.noise(2, torch.Generator().manual_seed(4))
    v = backbone.velocity(x, torch.tensor([0.8, 0.4]), backbone.encode(_prompts(_sources(2, size=16))))
    v.square().sum().backward()
    assert all(p.grad is not None for p in backbone.transformer.parameters() if p.requires_grad)


def test_probe_measures_the_target_rows_only() -> None:
    """AEGPO's probe: the velocity unchanged, and the entropy of the target's query rows (the source's tokens are
    keys, not measured rows): it equals the probe restricted to those rows and differs from every image row's."""
    from flowrl.backbones.common.probe_options import AttentionEntropyOptions
    from flowrl.backbones.flux.probe import entropy_probe

    backbone = flowrl.build("backbone", {**SETTINGS, "resolution": 16})
    x = backbone.noise(2, torch.Generator().manual_seed(5))
    s = torch.tensor([0.9, 0.5])
    cond = backbone.encode(_prompts(_sources(2, size=16)))
    options = AttentionEntropyOptions()
    with torch.no_grad():
        v, entropy = backbone.velocity_and_entropy(x, s, cond, options)
        assert torch.equal(v, backbone.velocity(x, s, cond))
        measured = {}
        for rows in (x.shape[1], None):
            with entropy_probe(backbone.module, options, int(cond.tensors["embeds"].shape[1]), rows) as recorder:
                backbone.velocity(x, s, cond)
            measured[rows] = recorder.entropy()
    assert entropy.shape == (2,) and torch.isfinite(entropy).all() and (entropy >= 0).all()
    assert torch.allclose(entropy, measured[x.shape[1]], atol=1e-6)
    assert not torch.allclose(entropy, measured[None], atol=1e-4)


SMOKE = ROOT / "recipes" / "smoke" / "flux_kontext.toml"


def test_smoke_recipe_validates() -> None:
    command = [sys.executable, "-m", "flowrl.cli.main", "validate", str(SMOKE)]
    out = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.slow
def test_smoke_recipe_trains_two_iterations(tmp_path) -> None:
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
