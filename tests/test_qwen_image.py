"""The Qwen-Image adapter on its tiny twin: equivalence with diffusers' QwenImagePipeline (true CFG on and off, the
pipeline's dynamic-shift grid and flowrl's uniform one), the norm rescale and the frozen negative branch, NFE,
img_shapes and the text mask, the template drop, the embedding cache, the attention-entropy probe, LoRA targets,
gradient checkpointing, FSDP units, reduced precision, loading a saved folder, and a 2-iteration train."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import ROOT, tiny_recipe

import flowrl
from flowrl.backbones.qwen_image.tokenizer import template_prefix_length
from flowrl.config.recipe import load_recipe, recipe_from_dict
from flowrl.config.settings import LoraConfig
from flowrl.core.registry import registry
from flowrl.core.types import Conditioning, Plan, Schedule
from flowrl.evaluation.evaluate import ode_images
from flowrl.parts.samplers.walk import walk
from flowrl.trainer.lora import add_lora
from flowrl.trainer.sharding import sharding_units

PROMPTS = ["a red circle", "two blue squares", "a cat on the grass"]  # 3, 3 and 5 words: a padded batch


def _backbone(**options: object) -> Any:
    return flowrl.build("backbone", {"type": "tiny_qwen_image", **options})


def _ode(backbone: Any, steps: int, x1: torch.Tensor, shift: float = 3.0) -> torch.Tensor:
    schedule = Schedule(backbone.schedule_sigmas(steps, shift), flowrl.build("kernel", {"type": "ode"}))
    with torch.no_grad():
        cond = backbone.encode(PROMPTS)
        return walk(backbone, x1, cond, torch.arange(len(PROMPTS)), 0, Plan((), ()), schedule, None)


@pytest.mark.parametrize("true_cfg_scale", [1.0, 4.0])
@pytest.mark.parametrize("grid", ["diffusers", "uniform"])
def test_all_ode_plan_matches_qwen_image_pipeline(true_cfg_scale: float, grid: str) -> None:
    backbone = _backbone(true_cfg_scale=true_cfg_scale, grid=grid)
    steps = 5
    x1 = backbone.noise(len(PROMPTS), torch.Generator().manual_seed(1))
    ours = _ode(backbone, steps, x1)
    pipe, sigmas = backbone.pipe, None
    if grid == "uniform":  # flowrl's shifted grid is a plain shift-3 scheduler given linspace(1, 1/N, N)
        from diffusers import FlowMatchEulerDiscreteScheduler

        pipe = type(pipe)(**{**pipe.components, "scheduler": FlowMatchEulerDiscreteScheduler(shift=3.0)})
        sigmas = list(np.linspace(1.0, 1 / steps, steps))
    with torch.no_grad():
        theirs = pipe(
            prompt=PROMPTS,
            negative_prompt=[" "] * len(PROMPTS) if true_cfg_scale > 1 else None,
            true_cfg_scale=true_cfg_scale,
            latents=x1.clone(),
            num_inference_steps=steps,
            sigmas=sigmas,
            height=32,
            width=32,
            max_sequence_length=backbone.config.max_sequence_length,
            output_type="latent",
        ).images
    assert ours.shape == theirs.shape == (3, 16, 16)
    # the same modules on the same inputs: the gap measured is 0 with the pipeline's grid (its sigmas reach the
    # model bit for bit) and up to 9.5e-7 with the uniform grid (flowrl's float64 grid rounded to float32, and
    # flowrl's float64 step sizes), on latents of ~4; 1e-5 of the latents' scale is 40x that
    assert (ours - theirs).abs().max() <= 1e-5 * theirs.abs().max()
    assert ours.std() > 0.1


def test_diffusers_grid_is_the_pipelines_dynamically_shifted_one() -> None:
    from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift

    backbone = _backbone()
    config = backbone.pipe.scheduler.config
    sigmas = backbone.schedule_sigmas(10, 3.0)
    scheduler = type(backbone.pipe.scheduler).from_config(config)
    mu = calculate_shift(16, config.base_image_seq_len, config.max_image_seq_len, config.base_shift, config.max_shift)
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 0.1, 10), mu=mu)
    assert sigmas == tuple(float(s) for s in scheduler.sigmas)  # exact: the same computation
    assert sigmas[0] == 1.0 and abs(sigmas[-2] - 0.02) < 1e-6 and sigmas[-1] == 0.0  # Qwen-Image's terminal level
    assert sigmas != _backbone(grid="uniform").schedule_sigmas(10, 3.0)
    assert backbone.schedule_sigmas(1, 3.0) == (1.0, 0.0)  # the stretch to 0.02 has no one-step grid


def test_true_cfg_rescales_every_token_to_the_conditional_norm() -> None:
    guided = _backbone(resolution=16, true_cfg_scale=4.0)
    plain = _backbone(resolution=16, true_cfg_scale=1.0)  # the same weights (seed 0), unguided
    x = guided.noise(2, torch.Generator().manual_seed(0))
    s = torch.tensor([0.9, 0.4])
    with torch.no_grad():
        v = guided.velocity(x, s, guided.encode(["a cat", "a dog"]))
        v_cond = plain.velocity(x, s, plain.encode(["a cat", "a dog"]))
        v_neg = plain.velocity(x, s, plain.encode([" ", " "]))
    comb = v_neg + 4.0 * (v_cond - v_neg)
    # fp32 arithmetic on velocities of ~1: agreement to 1e-5 relative is rounding
    torch.testing.assert_close(v.norm(dim=-1), v_cond.norm(dim=-1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(v, comb * v_cond.norm(dim=-1, keepdim=True) / comb.norm(dim=-1, keepdim=True))
    assert float((v - v_cond).abs().max()) > 1e-3  # the guidance changed directions
    assert float((comb.norm(dim=-1) - v_cond.norm(dim=-1)).abs().max()) > 1e-3  # and the rescale did something


def test_nfe_counts_two_rows_per_guided_step() -> None:
    for scale, per_row in ((4.0, 2), (1.0, 1)):
        backbone = _backbone(resolution=16, true_cfg_scale=scale)
        schedule = Schedule(backbone.schedule_sigmas(3, 3.0), flowrl.build("kernel", {"type": "ode"}))
        ode_images(backbone, ["a", "b"], schedule, seed=0)
        assert backbone.nfe == 2 * 3 * per_row


def test_negative_branch_is_frozen() -> None:
    """With grad on, the negative forward runs without gradient: the gradient is the formula's with v_neg constant."""
    backbone = _backbone(resolution=16, true_cfg_scale=3.0)
    backbone.transformer.requires_grad_(True)
    grad_modes: list[bool] = []
    hook = backbone.transformer.register_forward_pre_hook(lambda *_: grad_modes.append(torch.is_grad_enabled()))
    x = backbone.noise(2, torch.Generator().manual_seed(0))
    s = torch.tensor([0.8, 0.4])
    cond = backbone.encode(["a cat", "a dog"])
    v = backbone.velocity(x, s, cond)
    hook.remove()
    assert grad_modes == [True, False]  # conditional with gradient, negative without
    params = list(backbone.transformer.parameters())
    grads = torch.autograd.grad(v.square().sum(), params, allow_unused=True)
    embeds, mask = backbone.trimmed(cond)
    t = backbone.model_time(s)
    v_cond = backbone._forward(x, t, embeds, mask)
    with torch.no_grad():
        neg = backbone.unconditional()
        v_neg = backbone._forward(x, t, neg.expand(2, *neg.shape), None)
    comb = v_neg + 3.0 * (v_cond - v_neg)
    expected_v = comb * v_cond.norm(dim=-1, keepdim=True) / comb.norm(dim=-1, keepdim=True)
    expected = torch.autograd.grad(expected_v.square().sum(), params, allow_unused=True)
    for got, want in zip(grads, expected, strict=True):
        if want is None:
            assert got is None or float(got.abs().max()) == 0
        else:
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_img_shapes_timestep_and_text_mask_reach_the_transformer() -> None:
    backbone = _backbone(true_cfg_scale=1.0)
    seen: list[dict[str, Any]] = []
    hook = backbone.transformer.register_forward_pre_hook(lambda _m, _a, kw: seen.append(kw), with_kwargs=True)
    x = backbone.noise(3, torch.Generator().manual_seed(0))
    s = torch.tensor([0.9, 0.5, 0.25])
    with torch.no_grad():
        cond = backbone.encode(PROMPTS)
        v = backbone.velocity(x, s, cond)
        alone = backbone.velocity(x[2:], s[2:], backbone.encode(PROMPTS[2:]))
    hook.remove()
    lengths = cond.tensors["mask"].sum(1).tolist()
    assert cond.tensors["embeds"].shape == (3, 32, 16) and lengths == [3 + 5, 3 + 5, 5 + 5]  # words + closing
    assert seen[0]["img_shapes"] == [(1, 4, 4)] * 3  # 32 px: 8x8 latent cells, 2x2 per token
    assert torch.equal(seen[0]["timestep"], (s * 1000) / 1000)  # t in [0, 1], computed as the pipeline does
    assert seen[0]["encoder_hidden_states"].shape[1] == 10 and seen[0]["encoder_hidden_states_mask"] is not None
    assert seen[1]["encoder_hidden_states_mask"] is None  # one prompt, no padding: no mask, as in the pipeline
    # fp32 on velocities of ~1; padded keys get exactly zero weight, so only the batch shape moves the sums
    torch.testing.assert_close(v[2:], alone, rtol=1e-5, atol=1e-5)
    unmasked = Conditioning({"embeds": cond.tensors["embeds"], "mask": torch.ones_like(cond.tensors["mask"])})
    with torch.no_grad():
        attending_to_padding = backbone.velocity(x, s, unmasked)
    assert float((attending_to_padding[0] - v[0]).abs().max()) > 1e-4  # the mask matters for the padded rows


def test_template_drop_keeps_exactly_the_prompts_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    backbone = _backbone(resolution=16)
    pipe, tok = backbone.pipe, backbone.pipe.tokenizer
    drop = pipe.prompt_template_encode_start_idx
    assert template_prefix_length(tok, pipe.prompt_template_encode) == drop == 34
    prompt = "a red circle, left of two blue squares"
    ids = tok(pipe.prompt_template_encode.format(prompt))["input_ids"]
    own = tok(prompt, add_special_tokens=False)["input_ids"]
    assert ids[drop : drop + len(own)] == own and tok.unk_token_id not in own
    assert tok.convert_ids_to_tokens(ids[drop + len(own) :]) == ["<|im_end|>", "\n", "<|im_start|>", "assistant", "\n"]
    assert int(backbone.encode([prompt]).tensors["mask"].sum()) == len(own) + 5
    from flowrl.backbones.qwen_image.adapter import warn_if_template_drop_is_off

    capsys.readouterr()
    warn_if_template_drop_is_off(pipe)
    assert capsys.readouterr().err == ""
    pipe.prompt_template_encode_start_idx = 33
    warn_if_template_drop_is_off(pipe)
    assert "drops 33" in capsys.readouterr().err


def test_text_embeddings_are_cached_per_prompt(monkeypatch: pytest.MonkeyPatch) -> None:
    backbone = _backbone(resolution=16)
    calls: list[list[str]] = []
    original = backbone.pipe.encode_prompt

    def counting(*args: object, **kwargs: object) -> object:
        calls.append(list(kwargs["prompt"]))  # type: ignore[call-overload]
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
    assert calls == [["a cat", "a dog"], [" "]]  # the negative prompt, encoded once


def test_attention_probe_leaves_the_velocity_and_skips_padded_keys() -> None:
    from flowrl.backbones.common.probe_options import AttentionEntropyOptions
    from flowrl.core.interfaces import AttentionEntropyProbe

    backbone = _backbone()
    capability: object = backbone
    assert isinstance(capability, AttentionEntropyProbe)
    x = backbone.noise(3, torch.Generator().manual_seed(0))
    s = torch.tensor([0.9, 0.5, 0.25])
    with torch.no_grad():
        cond = backbone.encode(PROMPTS)
        v = backbone.velocity(x, s, cond)
        nfe = backbone.nfe
        probed, entropy = backbone.velocity_and_entropy(x, s, cond, None)
        assert backbone.nfe - nfe == 2 * 3  # counted like velocity (true CFG: two rows per latent)
        _, alone = backbone.velocity_and_entropy(x[:1], s[:1], backbone.encode(PROMPTS[:1]), None)
        _, normalised = backbone.velocity_and_entropy(x, s, cond, AttentionEntropyOptions(normalise=True, layers=(1,)))
    assert torch.equal(probed, v)  # the same kernel on the same inputs
    keys = 10 + 16  # the longest prompt's tokens + image tokens
    assert entropy.shape == (3,) and bool(((entropy > 0) & (entropy <= np.log(keys))).all())
    # row 0 is padded in the batch (8 of 10 text tokens): its entropy is the unpadded one, up to fp32 rounding
    torch.testing.assert_close(entropy[:1], alone, rtol=1e-5, atol=1e-6)
    assert bool(((normalised > 0) & (normalised <= 1)).all())
    assert all(type(b.attn.processor).__name__ == "QwenDoubleStreamAttnProcessor2_0"
               for b in backbone.transformer.transformer_blocks)  # restored


def test_lora_targets_match_the_tiny_transformer_and_train() -> None:
    from torch import nn

    from flowrl.backbones.qwen_image.adapter import QwenImageFromPretrained
    from flowrl.backbones.qwen_image.tiny import TinyQwenImage

    assert TinyQwenImage.lora_targets == QwenImageFromPretrained.lora_targets
    backbone = _backbone(resolution=16)
    transformer = backbone.transformer
    linears = [n for n, m in transformer.named_modules() if isinstance(m, nn.Linear)]
    for target in TinyQwenImage.lora_targets:
        assert any(n == target or n.endswith("." + target) for n in linears), target
    add_lora(transformer, LoraConfig(rank=4), TinyQwenImage.lora_targets)
    adapted = {n.rsplit(".lora_A", 1)[0] for n, _ in transformer.named_modules() if n.endswith("lora_A")}
    assert len(adapted) == len(TinyQwenImage.lora_targets) * len(transformer.transformer_blocks)
    transformer.enable_gradient_checkpointing()
    assert transformer.is_gradient_checkpointing
    x = backbone.noise(2, torch.Generator().manual_seed(0))
    v = backbone.velocity(x, torch.tensor([0.9, 0.3]), backbone.encode(["a cat", "a dog"]))
    v.square().mean().backward()
    trained = [p for p in transformer.parameters() if p.requires_grad]
    assert trained and sum(float(p.grad.abs().sum()) for p in trained if p.grad is not None) > 0


def test_fsdp_units_are_the_transformer_blocks() -> None:
    from diffusers.models.transformers.transformer_qwenimage import QwenImageTransformerBlock

    transformer = _backbone(resolution=16, num_layers=3).transformer
    units = sharding_units(transformer)
    assert len(units) == 3 and all(isinstance(u, QwenImageTransformerBlock) for u in units)


@pytest.mark.parametrize("lora", [True, False])
def test_reduced_precision_trains_with_fp32_velocities(lora: bool) -> None:
    backbone = _backbone(resolution=16, dtype="bfloat16")
    transformer = backbone.transformer
    if lora:
        add_lora(transformer, LoraConfig(rank=4), backbone.lora_targets)
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


def test_trainer_runs_qwen_image_flow_grpo_with_lora_checkpointing_and_bf16() -> None:
    """Two iterations of Flow-GRPO's shape: independent rollouts, every step SDE, a trained prefix."""
    from accelerate.state import AcceleratorState

    from flowrl.trainer.loop import Trainer

    data = tiny_recipe(gradient_checkpointing=True, mixed_precision="bf16")
    data["backbone"] = {"type": "tiny_qwen_image", "resolution": 16, "num_layers": 1, "dtype": "bfloat16"}
    data["selector"] = {"type": "flow_grpo_prefix", "train_fraction": 0.5}
    data["lora"] = {"rank": 4}  # target_modules from the backbone's lora_targets
    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            trainer = Trainer(recipe_from_dict(data), Path(tmp), quiet=True)
            assert trainer.backbone.transformer.is_gradient_checkpointing
            first = trainer.iteration()
            second = trainer.iteration()
            trainer.logger.close()
            trainer.release()
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    for metrics in (first, second):
        assert np.isfinite(metrics["loss"]) and metrics["grad_norm"] > 0
    assert first["nfe"] == 2 * 2 * 4 * 4  # prompts x G x steps x 2 rows (true CFG)


def test_sharded_training_runs_on_one_process(tmp_path: Path) -> None:
    """trainer.sharding = "fsdp": FSDP2 units on the Qwen-Image blocks, the img_shapes/mask kwargs pass through."""
    from flowrl.trainer.loop import Trainer

    data = tiny_recipe(sharding="fsdp")
    data["backbone"] = {"type": "tiny_qwen_image", "resolution": 16, "num_layers": 2}
    data["lora"] = {"rank": 4}
    data["trainer"]["max_steps"] = 1
    trainer = Trainer(recipe_from_dict(data), tmp_path, quiet=True)
    metrics = trainer.iteration()
    trainer.logger.close()
    trainer.release()
    assert np.isfinite(metrics["loss"]) and metrics["grad_norm"] > 0


def test_aegpo_probes_the_tiny_twin_and_trains(tmp_path: Path) -> None:
    """AEGPO's selector probes Qwen-Image's attention (one probed guided velocity a step: 2 rows a latent)."""
    import tomllib

    from flowrl.trainer.loop import Trainer

    data = tomllib.loads((ROOT / "recipes" / "aegpo.toml").read_text())
    data["backbone"] = {"type": "tiny_qwen_image", "resolution": 16, "num_layers": 1}
    data["prompts"] = {"type": "list", "prompts": ["a red circle", "two blue squares", "a cat"], "heldout": ["a dog"]}
    data["reward"] = [{"type": "jpeg_compressibility", "scale_kb": 1.0}]
    data["schedule"] = {"num_steps": 4, "shift": 3.0}
    data["selector"]["k"] = 2
    data["lora"] = {"rank": 4}
    data["trainer"] = {"max_steps": 1, "prompts_per_step": 2, "checkpoint_every": 0, "image_every": 0, "eval_every": 0}
    trainer = Trainer(recipe_from_dict(data), tmp_path, quiet=True)
    metrics = trainer.iteration()
    trainer.logger.close()
    trainer.release()
    assert np.isfinite(metrics["loss"]) and metrics["grad_norm"] > 0
    assert metrics["plan/aegpo/probe_nfe"] == 2 * 4 * 2  # prompts x steps x 2 rows (one probed guided velocity)
    low, high = metrics["plan/aegpo/entropy_curve/min"], metrics["plan/aegpo/entropy_curve/max"]
    assert 0 < low <= high <= np.log(8 + 4)  # at most log(keys): 8 text tokens at most and 4 image tokens


def test_qwen_image_loads_a_saved_folder_and_fails_clearly_offline(tmp_path: Path) -> None:
    from flowrl.backbones.qwen_image.tiny import TinyQwenImageSpec, save_tiny_qwen_image

    save_tiny_qwen_image(TinyQwenImageSpec(image_size=16), tmp_path / "model")
    loaded = flowrl.build(
        "backbone",
        {"type": "qwen_image", "path": str(tmp_path / "model"), "resolution": 16, "max_sequence_length": 32,
         "dtype": "float32"},
    )  # fmt: skip
    built = _backbone(resolution=16)
    x1 = loaded.noise(3, torch.Generator().manual_seed(0))
    assert torch.equal(_ode(loaded, 2, x1), _ode(built, 2, x1))  # exact: the same weights and code, one process
    assert loaded.decode(x1).shape == (3, 3, 16, 16)
    with pytest.raises(OSError, match="cannot load QwenImagePipeline from hub id"):
        flowrl.build("backbone", {"type": "qwen_image", "path": "nobody/no-such-model-xyz"})
    with pytest.raises(ValueError, match="multiple of 8"):
        _backbone(resolution=20)


def test_bad_settings_are_refused_at_validate(tmp_path: Path) -> None:
    from flowrl.backbones.qwen_image.tiny import TinyQwenImageSpec, save_tiny_qwen_image

    folder = save_tiny_qwen_image(TinyQwenImageSpec(image_size=16), tmp_path / "model")
    cls: Any = registry("backbone").get("qwen_image")
    problems = dict(cls.check_config(cls.Config(path=str(folder), resolution=20, max_sequence_length=2000)))
    assert "multiple of 8" in problems["resolution"] and "at most 1024" in problems["max_sequence_length"]
    on_meta = cls.transformer_on_meta(cls.Config(path="nobody/no-such-model-xyz"))  # not on this machine
    assert len(on_meta.transformer_blocks) == 60 and on_meta.proj_out.weight.is_meta  # Qwen-Image's defaults
    tiny: Any = registry("backbone").get("tiny_qwen_image")
    assert tiny.check_config(tiny.Config(axes_dims_rope=(8, 4, 2)))[0][0] == "axes_dims_rope"


@pytest.mark.parametrize("path", sorted((ROOT / "recipes" / "qwen_image").glob("*.toml")) + [
    ROOT / "recipes" / "smoke" / "qwen_image.toml"], ids=lambda p: p.name)  # fmt: skip
def test_shipped_qwen_image_recipes_validate(path: Path) -> None:
    recipe = load_recipe(path)
    assert recipe.parts["backbone"].type in ("qwen_image", "tiny_qwen_image", "qwen_image_edit")
    from flowrl.backbones.lora.targets import lora_target_problems

    assert list(lora_target_problems(recipe)) == []


@pytest.mark.slow
def test_smoke_recipe_trains(tmp_path: Path) -> None:
    from flowrl.trainer.loop import Trainer

    trainer = Trainer(load_recipe(ROOT / "recipes" / "smoke" / "qwen_image.toml"), tmp_path, quiet=True)
    metrics = trainer.iteration()
    trainer.logger.close()
    trainer.release()
    assert np.isfinite(metrics["loss"])
