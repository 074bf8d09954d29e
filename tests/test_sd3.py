"""The SD3 adapter: diffusers' StableDiffusion3Pipeline equivalence (with and without CFG), the frozen
unconditional branch, NFE counting, the text-embedding cache, reduced precision, loading from a folder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_recipe

import flowrl
from flowrl.config.recipe import recipe_from_dict
from flowrl.config.settings import LoraConfig
from flowrl.core.types import Plan, Schedule
from flowrl.evaluation.evaluate import ode_images
from flowrl.parts.samplers.walk import walk
from flowrl.trainer.loop import Trainer
from flowrl.trainer.lora import add_lora

PROMPTS = ["a red circle", "two blue squares", "a cat on a mat"]


def _backbone(**options: object) -> flowrl.Backbone:
    return flowrl.build("backbone", {"type": "tiny_sd3", "resolution": 32, **options})


def _ode(backbone: flowrl.Backbone, steps: int, x1: torch.Tensor) -> torch.Tensor:
    schedule = Schedule(backbone.schedule_sigmas(steps, 3.0), flowrl.build("kernel", {"type": "ode"}))
    with torch.no_grad():
        cond = backbone.encode(PROMPTS)
        return walk(backbone, x1, cond, torch.arange(len(PROMPTS)), 0, Plan((), ()), schedule, None)


@pytest.mark.parametrize("guidance_scale", [1.0, 4.5])
@pytest.mark.parametrize("grid", ["uniform", "diffusers"])
def test_all_ode_plan_matches_sd3_pipeline(guidance_scale: float, grid: str) -> None:
    backbone = _backbone(guidance_scale=guidance_scale, grid=grid)
    steps = 5
    x1 = backbone.noise(len(PROMPTS), torch.Generator().manual_seed(1))
    ours = _ode(backbone, steps, x1)
    # "uniform" is flowrl's grid (given to the pipeline as sigmas); "diffusers" is the pipeline's default
    sigmas = list(np.linspace(1.0, 1 / steps, steps)) if grid == "uniform" else None
    with torch.no_grad():
        theirs = backbone.pipe(
            prompt=PROMPTS,
            latents=x1.clone(),
            num_inference_steps=steps,
            height=32,
            width=32,
            guidance_scale=guidance_scale,
            max_sequence_length=backbone.config.max_sequence_length,
            sigmas=sigmas,
            output_type="latent",
        ).images
    assert ours.shape == theirs.shape == (3, 4, 16, 16)
    # not bitwise: the pipeline encodes the negative prompt with the batch (flowrl once, alone) and gets the uniform
    # grid as a list; the gap moves with the thread count and the processor (up to 2.9e-6 measured, on latents of
    # ~4.3 with CFG): a tolerance of 1e-5 of the latents' scale is 15x that
    assert (ours - theirs).abs().max() <= 1e-5 * theirs.abs().max()
    assert ours.std() > 0.1


def test_nfe_counts_two_rows_per_guided_step() -> None:
    for scale, per_row in ((4.5, 2), (1.0, 1)):
        backbone = _backbone(resolution=16, guidance_scale=scale)
        schedule = Schedule(backbone.schedule_sigmas(3, 3.0), flowrl.build("kernel", {"type": "ode"}))
        ode_images(backbone, ["a", "b"], schedule, seed=0)
        assert backbone.nfe == 2 * 3 * per_row


def test_unconditional_branch_is_frozen() -> None:
    """With grad on, the uncond forward has no gradient: d v / d theta = scale * d v_cond / d theta."""
    backbone = _backbone(resolution=16, guidance_scale=3.0)
    backbone.transformer.requires_grad_(True)
    x = backbone.noise(2, torch.Generator().manual_seed(0))
    s = torch.tensor([0.8, 0.4])
    cond = backbone.encode(["a cat", "a dog"])
    with torch.no_grad():
        batched = backbone.velocity(x, s, cond)  # rollout path: one [uncond; cond] forward
    v = backbone.velocity(x, s, cond)  # training path: separate forwards
    assert torch.allclose(v, batched, atol=1e-5)
    params = [p for p in backbone.transformer.parameters()]
    grads = torch.autograd.grad(v.square().sum(), params, allow_unused=True)
    weight = 2 * v.detach()  # d(v^2)/dv
    v_cond = backbone._forward(x, s * 1000, cond.tensors["embeds"], cond.tensors["pooled"])
    expected = torch.autograd.grad((3.0 * v_cond * weight).sum(), params, allow_unused=True)
    for got, want in zip(grads, expected, strict=True):
        if want is None:
            assert got is None or float(got.abs().max()) == 0
        else:
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_text_embeddings_are_cached_per_prompt(monkeypatch: pytest.MonkeyPatch) -> None:
    backbone = _backbone(resolution=16)
    calls: list[list[str]] = []
    original = backbone.pipe.encode_prompt

    def counting(*args: object, **kwargs: object) -> object:
        calls.append(list(kwargs["prompt"]))  # type: ignore[arg-type]
        return original(*args, **kwargs)

    monkeypatch.setattr(backbone.pipe, "encode_prompt", counting)
    first = backbone.encode(["a cat", "a dog", "a cat"])
    second = backbone.encode(["a dog", "a cat"])
    assert calls == [["a cat", "a dog"]]
    assert torch.equal(first.tensors["embeds"][1], second.tensors["embeds"][0])
    x = backbone.noise(2, torch.Generator().manual_seed(0))
    with torch.no_grad():
        for _ in range(3):
            backbone.velocity(x, torch.full((2,), 0.5), second)
    assert calls == [["a cat", "a dog"], [""]]  # the negative prompt, encoded once


@pytest.mark.parametrize("kind", ["tiny_sd3", "tiny_flux"])
@pytest.mark.parametrize("lora", [True, False])
def test_reduced_precision_trains_with_fp32_velocities(kind: str, lora: bool) -> None:
    """bf16 transformer weights + fp32 trainable weights (LoRA, or a full fine-tune's master weights) under autocast."""
    backbone = flowrl.build("backbone", {"type": kind, "resolution": 16, "dtype": "bfloat16"})
    transformer = backbone.transformer
    if lora:
        add_lora(transformer, LoraConfig(rank=4))
        assert {p.dtype for p in transformer.parameters() if not p.requires_grad} == {torch.bfloat16}
    else:
        transformer.requires_grad_(True)
    trained = [p for p in transformer.parameters() if p.requires_grad]
    for p in trained:  # what the trainer does
        p.data = p.data.float()
    x = backbone.noise(2, torch.Generator().manual_seed(0))
    v = backbone.velocity(x, torch.tensor([0.9, 0.3]), backbone.encode(["a cat", "a dog"]))
    assert v.dtype == torch.float32 and bool(torch.isfinite(v).all())
    v.square().mean().backward()
    assert sum(float(p.grad.abs().sum()) for p in trained if p.grad is not None) > 0


def test_trainer_runs_sd3_with_lora_checkpointing_and_bf16() -> None:
    data = tiny_recipe(gradient_checkpointing=True, mixed_precision="bf16")
    data["backbone"] = {"type": "tiny_sd3", "resolution": 16, "num_layers": 1, "dtype": "bfloat16"}
    data["lora"] = {"rank": 4}
    data["trainer"]["max_steps"] = 1
    import tempfile

    from accelerate.state import AcceleratorState

    # accelerate's state is a process-wide singleton: a different mixed_precision needs a reset, before and after
    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            trainer = Trainer(recipe_from_dict(data), Path(tmp), quiet=True)
            assert trainer.backbone.transformer.is_gradient_checkpointing
            metrics = trainer.iteration()
            trainer.logger.close()  # before the folder goes: TensorBoard's writer thread would write into it
            trainer.release()
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    assert np.isfinite(metrics["loss"]) and metrics["grad_norm"] > 0
    assert metrics["nfe"] == 2 * 2 * 4 * 4  # prompts x G x steps x 2 rows (CFG)


def test_sd3_loads_a_saved_folder_and_fails_clearly_offline(tmp_path: Path) -> None:
    from flowrl.backbones.sd3.tiny import TinySD3Spec, save_tiny_sd3

    save_tiny_sd3(TinySD3Spec(image_size=16), tmp_path / "model")
    loaded = flowrl.build(
        "backbone",
        {
            "type": "sd3",
            "path": str(tmp_path / "model"),
            "resolution": 16,
            "max_sequence_length": 16,
            "dtype": "float32",
        },
    )
    built = flowrl.build("backbone", {"type": "tiny_sd3", "resolution": 16})
    x1 = loaded.noise(3, torch.Generator().manual_seed(0))
    assert torch.equal(_ode(loaded, 2, x1), _ode(built, 2, x1))  # exact: the same weights and code, one process
    with pytest.raises(OSError, match="cannot load StableDiffusion3Pipeline from hub id"):
        flowrl.build("backbone", {"type": "sd3", "path": "nobody/no-such-model-xyz"})
    with pytest.raises(ValueError, match="multiple of 4"):
        _backbone(resolution=18)
