"""flowrl's ODE sampler is diffusers' FluxPipeline: same model, prompts and initial latents, same output."""

from __future__ import annotations

import pytest
import torch

import flowrl
from flowrl.core.rng import RolloutRNG
from flowrl.core.types import Plan, Schedule
from flowrl.evaluation.evaluate import ode_images
from flowrl.parts.samplers.walk import walk


@pytest.mark.parametrize("pixel_space", [False, True])
@pytest.mark.parametrize("steps", [4, 8])
def test_all_ode_plan_matches_flux_pipeline(pixel_space: bool, steps: int) -> None:
    backbone = flowrl.build("backbone", {"type": "tiny_flux", "pixel_space": pixel_space, "resolution": 32})
    kernel = flowrl.build("kernel", {"type": "flow_grpo_sde"})
    schedule = Schedule(backbone.schedule_sigmas(steps, 3.0), kernel)
    prompts = ["a red circle", "two blue squares", "a cat on a mat"]
    x1 = backbone.noise(len(prompts), torch.Generator().manual_seed(1))
    # With vae=None diffusers assumes 16 pixels per token; ask for the size that gives our token grid.
    size = backbone.latent_grid() * 16 if pixel_space else 32
    with torch.no_grad():
        ours = walk(backbone, x1, backbone.encode(prompts), torch.arange(3), 0, Plan((), ()), schedule, None)
        theirs = backbone.pipe(
            prompt=prompts,
            latents=x1.clone(),
            num_inference_steps=steps,
            height=size,
            width=size,
            max_sequence_length=backbone.config.max_sequence_length,
            output_type="latent",
        ).images
    assert ours.shape == theirs.shape
    assert (ours - theirs).abs().max() <= 1e-5
    assert ours.std() > 0.1  # a real image-scale output, not zeros


def test_nfe_counts_rows() -> None:
    backbone = flowrl.build("backbone", {"type": "tiny_flux", "resolution": 16})
    schedule = Schedule(backbone.schedule_sigmas(5, 3.0), flowrl.build("kernel", {"type": "ode"}))
    ode_images(backbone, ["a", "b", "c"], schedule, seed=0)
    assert backbone.nfe == 15


def test_sde_plan_with_zero_noise_equals_ode() -> None:
    backbone = flowrl.build("backbone", {"type": "tiny_flux", "resolution": 16})
    prompts = ["a red circle", "a dog"]
    x1 = backbone.noise(2, torch.Generator().manual_seed(0))
    cond = backbone.encode(prompts)
    out = []
    for kernel in ({"type": "flow_grpo_sde", "noise_level": 0.0}, {"type": "ode"}):
        schedule = Schedule(backbone.schedule_sigmas(4, 3.0), flowrl.build("kernel", kernel))
        plan = Plan(units=(flowrl.Unit(0), flowrl.Unit(1, 2)), trained=(0, 1))
        with torch.no_grad():
            out.append(walk(backbone, x1, cond, torch.arange(2), 0, plan, schedule, RolloutRNG(0, 0, [0, 1])))
    assert torch.allclose(out[0], out[1], atol=1e-6)
