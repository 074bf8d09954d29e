"""LoRA trained by flowrl, exported in the diffusers format, loads into a fresh diffusers pipeline that then
samples exactly what flowrl's sampler samples with the trained weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import tiny_recipe

from flowrl.backbones.lora.export import LORA_FOLDER, export_lora, lora_state_dict
from flowrl.config.recipe import recipe_from_dict
from flowrl.core.types import Plan, Schedule
from flowrl.parts.samplers.walk import walk
from flowrl.trainer.loop import Trainer

STEPS = 4
PROMPTS = ["a red circle", "two blue squares", "a cat"]


def _base_model(kind: str, folder: Path) -> tuple[dict[str, Any], Any]:
    """Save a tiny random pipeline to ``folder``; the backbone table that loads it, and the pipeline class."""
    if kind == "flux":
        from diffusers import FluxPipeline

        from flowrl.backbones.flux.tiny import TinyFluxSpec, save_tiny_flux

        save_tiny_flux(TinyFluxSpec(image_size=16, pixel_space=False, num_layers=1, num_single_layers=1), folder)
        return {"type": "flux", "path": str(folder), "resolution": 16, "max_sequence_length": 16}, FluxPipeline
    from diffusers import StableDiffusion3Pipeline

    from flowrl.backbones.sd3.tiny import TinySD3Spec, save_tiny_sd3

    save_tiny_sd3(TinySD3Spec(image_size=16), folder)
    table = {"type": "sd3", "path": str(folder), "resolution": 16, "max_sequence_length": 16, "guidance_scale": 4.5}
    return table, StableDiffusion3Pipeline


@pytest.mark.parametrize("kind", ["flux", "sd3"])
def test_exported_lora_reproduces_flowrl_samples(kind: str, tmp_path: Path) -> None:
    table, pipeline_cls = _base_model(kind, tmp_path / "base")
    data = tiny_recipe()
    data["backbone"] = {**table, "dtype": "float32"}
    data["lora"] = {"rank": 4, "alpha": 8.0}  # scale alpha / rank = 2: the exported metadata must carry it
    data["optim"] = {"lr": 1e-2}
    trainer = Trainer(recipe_from_dict(data), tmp_path / "run", quiet=True)
    trainer.run()
    lora = tmp_path / "run" / "checkpoints" / "step_000002" / LORA_FOLDER
    assert (lora / "pytorch_lora_weights.safetensors").exists()

    backbone = trainer.backbone
    schedule = Schedule(backbone.schedule_sigmas(STEPS, 3.0), trainer.schedule.kernel)
    x1 = backbone.noise(len(PROMPTS), torch.Generator().manual_seed(3))
    backbone.module.eval()
    with torch.no_grad():
        ours = walk(backbone, x1, backbone.encode(PROMPTS), torch.arange(3), 0, Plan((), ()), schedule, None)

    fresh = pipeline_cls.from_pretrained(tmp_path / "base", local_files_only=True)
    fresh.set_progress_bar_config(disable=True)
    fresh.load_lora_weights(lora)
    kwargs: dict[str, Any] = {}
    if kind == "sd3":  # the SD3 pipeline's default grid is not the uniform one; give it flowrl's
        kwargs = {"guidance_scale": 4.5, "sigmas": list(np.linspace(1.0, 1 / STEPS, STEPS))}

    def sample() -> torch.Tensor:
        return fresh(  # type: ignore[no-any-return]
            prompt=PROMPTS,
            latents=x1.clone(),
            num_inference_steps=STEPS,
            height=16,
            width=16,
            max_sequence_length=16,
            output_type="latent",
            **kwargs,
        ).images

    theirs = sample()
    diff = float((ours - theirs).abs().max())
    print(f"{kind}: max |flowrl - diffusers with exported LoRA| = {diff:.3g}")
    assert ours.shape == theirs.shape
    assert diff <= 1e-4
    fresh.unload_lora_weights()
    assert float((ours - sample()).abs().max()) > 100 * max(diff, 1e-6)  # the trained LoRA matters


def test_export_without_lora_writes_nothing(tmp_path: Path) -> None:
    import flowrl

    backbone = flowrl.build("backbone", {"type": "tiny_flux", "resolution": 16})
    assert export_lora(backbone, tmp_path / "lora") is None
    assert not (tmp_path / "lora").exists()


def test_lora_state_dict_keys_are_diffusers_style() -> None:
    import flowrl
    from flowrl.config.settings import LoraConfig
    from flowrl.trainer.lora import add_lora

    backbone = flowrl.build("backbone", {"type": "tiny_sd3", "resolution": 16})
    add_lora(backbone.transformer, LoraConfig(rank=2, target_modules=("to_q",)))
    keys = list(lora_state_dict(backbone.transformer))
    assert keys and all(k.endswith((".lora_A.weight", ".lora_B.weight")) and ".default" not in k for k in keys)
