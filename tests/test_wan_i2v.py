"""The Wan image-to-video base (flowrl/backbones/wan/i2v.py) on its twin's three layouts: the deterministic ODE
sample is diffusers' WanImageToVideoPipeline on the same prompts, first frames, initial latents and steps (Wan 2.1
with CLIP, 2.2 A14B's two experts, 2.2 TI2V's replaced first frame; the check fails with another first frame), the
frame fitting, the refusals at recipe load, the trained expert (LoRA on it alone), a saved folder through
``wan_i2v``, the conformance rules, AEGPO's probe on the video rows, the memory pre-check's terms and the smoke
recipe."""

from __future__ import annotations

import math
import subprocess
import sys
import types
from typing import Any

import numpy as np
import pytest
import torch
from conftest import ROOT, tiny_recipe
from PIL import Image

import flowrl
from flowrl.backbones.common.tiny import save_pipeline
from flowrl.backbones.wan.tiny_i2v import TinyWanI2VSpec, tiny_wan_i2v_pipeline
from flowrl.config.recipe import RecipeError, recipe_from_dict
from flowrl.conformance import check_backbone
from flowrl.core.conditions import Condition, Prompt
from flowrl.core.types import Conditioning, Plan, Schedule
from flowrl.parts.samplers.walk import walk

TEXTS = ["a red circle", "two blue squares"]
SIZES = {"2.1": 16, "2.2-a14b": 16, "2.2-ti2v": 64}  # TI2V's VAE: 16 px a latent cell, 2 x 2 cells a token
VARIANTS = tuple(SIZES)


def settings(variant: str, **options: Any) -> dict[str, Any]:
    text = {"max_sequence_length": 512} if variant == "2.1" else {}
    return {"type": "tiny_wan_i2v", "variant": variant, "resolution": SIZES[variant], "grid": "diffusers", **text,
            **options}


def _frames(n: int, size: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in range(n)]


def _prompts(frames: list[np.ndarray]) -> list[str]:
    return [Prompt(t, [Condition(f)]) for t, f in zip(TEXTS, frames, strict=True)]


def _ode(backbone: Any, cond: Conditioning, x1: torch.Tensor, steps: int, shift: float = 3.0) -> torch.Tensor:
    schedule = Schedule(backbone.schedule_sigmas(steps, shift), flowrl.build("kernel", {"type": "ode"}))
    with torch.no_grad():
        return walk(backbone, x1, cond, torch.arange(x1.shape[0]), 0, Plan((), ()), schedule, None)


def _pipeline(backbone: Any, frames: list[np.ndarray], x1: torch.Tensor, steps: int, monkeypatch: Any) -> torch.Tensor:
    """WanImageToVideoPipeline.__call__ one prompt at a time (it takes one image a call), on its own scheduler grid
    (the base's ``grid = "diffusers"``). diffusers 0.42's image-to-video prompt cleaning calls ``ftfy`` even when it
    is not installed: an identity stands in (it changes nothing on these ASCII prompts)."""
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.wan import pipeline_wan_i2v

    monkeypatch.setattr(pipeline_wan_i2v, "ftfy", types.SimpleNamespace(fix_text=lambda t: t), raising=False)
    backbone.pipe.scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    c = backbone.config
    out = []
    with torch.no_grad():
        for i, (text, frame) in enumerate(zip(TEXTS, frames, strict=True)):
            out.append(backbone.pipe(
                image=Image.fromarray(frame), prompt=[text], latents=x1[i : i + 1].clone(), num_inference_steps=steps,
                height=backbone.height, width=backbone.width, num_frames=c.num_frames,
                guidance_scale=c.guidance_scale, guidance_scale_2=(c.guidance_scale_2 or None) if backbone.boundary
                else None, max_sequence_length=c.max_sequence_length, output_type="latent",
            ).frames)
    return torch.cat(out)


@pytest.mark.parametrize("variant", VARIANTS)
def test_ode_sample_equals_wan_image_to_video_pipeline(variant: str, monkeypatch: Any) -> None:
    backbone = flowrl.build("backbone", settings(variant, guidance_scale_2=3.0 if variant == "2.2-a14b" else 0.0))
    calls = {"transformer": 0, "transformer_2": 0}
    for name in calls:
        module = getattr(backbone.pipe, name, None)
        if module is not None:
            module.register_forward_pre_hook(lambda *_, n=name: calls.__setitem__(n, calls[n] + 1))
    size, steps = SIZES[variant], 5
    frames = _frames(2, size)
    x1 = backbone.noise(2, torch.Generator().manual_seed(1))
    cond = backbone.encode(_prompts(frames))
    ours = _ode(backbone, cond, x1, steps)
    ours_calls = dict(calls)
    theirs = _pipeline(backbone, frames, x1, steps, monkeypatch)
    assert ours.shape == theirs.shape == (2, *backbone.latent_shape)
    # Same float32 operations on the same tensors, except that flowrl runs [uncond; cond] as one batch of 4 and
    # both prompts together where the pipeline runs two forwards of one prompt each (and TI2V's first latent frame,
    # which flowrl walks to the image's latent and the pipeline overwrites with it at the end). Measured gaps: 2.1
    # 1.5e-6, 2.2-a14b 7.8e-7, 2.2-ti2v 1.3e-6, on latents of largest magnitude 3.8, 2.9 and 4.1: a few float32 ulps.
    # Tolerance 1e-5 of the largest magnitude (2.9e-5 to 4.1e-5): a margin of 20 or more, and 1/1000 to 1/10000 of
    # what another first frame changes (3.1e-2 to 2.7e-1; below).
    scale = float(theirs.abs().max())
    assert (ours - theirs).abs().max() <= 1e-5 * scale
    assert ours.std() > 0.1
    if variant == "2.2-a14b":  # the grid's first two steps (t 1000, 923) are the high-noise expert's, 3 the other's
        assert ours_calls == {"transformer": 2, "transformer_2": 3}
    # the check can fail: another first frame gives another sample
    other = _ode(backbone, backbone.encode(_prompts(_frames(2, size, seed=7))), x1, steps)
    assert (other - theirs).abs().max() > 100 * 1e-5 * scale


def test_ti2v_first_frame_is_the_image_latent_and_its_tokens_at_t0() -> None:
    backbone = flowrl.build("backbone", settings("2.2-ti2v"))
    seen: list[torch.Tensor] = []
    backbone.transformer.register_forward_pre_hook(
        lambda _m, _a, kw: seen.append(kw["timestep"].clone()), with_kwargs=True)
    frames = _frames(2, 64)
    cond = backbone.encode(_prompts(frames))
    x1 = backbone.noise(2, torch.Generator().manual_seed(2))
    out = _ode(backbone, cond, x1, 4)
    first = cond.tensors["frame"]  # (2, z, 1, h, w): the image's normalised latent
    assert first.shape == (2, backbone.latent_shape[0], 1, 4, 4)
    # the straight path to the image's latent ends on it: x' = x - (x - z) exactly up to float32 rounding
    assert (out[:, :, :1] - first).abs().max() <= 1e-5 * float(first.abs().max())
    tokens = 2 * 2  # a 4 x 4 latent frame in 2 x 2 patches
    assert seen[0].shape == (4, backbone.latent_shape[1] * tokens)  # [uncond; cond] rows x every token
    assert (seen[0][:, :tokens] == 0).all() and (seen[0][:, tokens:] == 1000.0).all()


def test_first_frame_is_fitted_and_text_prompts_refused() -> None:
    backbone = flowrl.build("backbone", settings("2.2-a14b", width=32))
    assert backbone.accepts(backbone.config).describe() == "exactly 1 image (the first frame)"
    wide = np.repeat(_frames(1, 16)[0], 3, axis=1)  # 16 x 48: covered at scale 1, centre-cropped to 16 x 32
    fitted = backbone.encode([Prompt("a cat", [Condition(wide)])]).tensors["frame"]
    direct = backbone.encode([Prompt("a cat", [Condition(np.ascontiguousarray(wide[:, 8:40]))])]).tensors["frame"]
    assert fitted.shape == (1, 8, 2, 4, 8) and torch.equal(fitted, direct)
    assert (fitted[0, :4, 0] == 1).all() and (fitted[0, :4, 1] == 0).all()  # the mask: first latent frame only
    with pytest.raises(ValueError, match="needs a first frame with every prompt"):
        backbone.encode(["a cat"])


@pytest.mark.parametrize(
    ("options", "key", "message"),
    [
        ({"resolution": 24}, "resolution", "must be a multiple of 16"),
        ({"variant": "2.2-ti2v", "resolution": 48}, "resolution", "must be a multiple of 32 for variant 2.2-ti2v"),
        ({"num_frames": 6}, "num_frames", "num_frames - 1 must be divisible by 4"),
        ({"max_sequence_length": 16}, "max_sequence_length", "must be 512 for Wan 2.1 I2V"),
        ({"expert": "low"}, "expert", "'low' needs a two-expert Wan 2.2 pipeline"),
    ],
)
def test_bad_settings_are_refused_at_recipe_load(options: dict[str, Any], key: str, message: str) -> None:
    data = tiny_recipe()
    data["backbone"] = {**settings("2.1"), **options}
    with pytest.raises(RecipeError, match=rf"\[backbone.{key}\].*{message}"):
        recipe_from_dict(data)


def test_wan_i2v_loads_a_saved_pipeline_and_checks_its_sides(tmp_path) -> None:
    for variant in ("2.1", "2.2-a14b"):
        folder = save_pipeline(tiny_wan_i2v_pipeline(TinyWanI2VSpec(variant=variant)), tmp_path / variant)
        text = 512 if variant == "2.1" else 16
        base = {"path": str(folder), "resolution": 16, "num_frames": 5, "max_sequence_length": text,
                "guidance_scale": 4.5, "dtype": "float32"}
        loaded = flowrl.build("backbone", {"type": "wan_i2v", **base})
        twin = flowrl.build("backbone", settings(variant, grid="uniform", max_sequence_length=text))
        prompts = _prompts(_frames(2, 16))
        x = twin.noise(2, torch.Generator().manual_seed(3))
        s = torch.tensor([0.95, 0.3])  # one row on each side of A14B's boundary
        with torch.no_grad():
            ours = loaded.velocity(x, s, loaded.encode(prompts))
            assert torch.allclose(ours, twin.velocity(x, s, twin.encode(prompts)), atol=1e-6)
        data = tiny_recipe()
        data["backbone"] = {"type": "wan_i2v", **base, "resolution": 24}
        refused = r"\[backbone.resolution\] height 24 must be a multiple of 16 for the model"
        with pytest.raises(RecipeError, match=refused):
            recipe_from_dict(data)
    data["backbone"] = {"type": "wan_i2v", **base, "max_sequence_length": 16, "expert": "low"}
    assert recipe_from_dict(data).parts["backbone"].config.expert == "low"  # A14B: no CLIP, two experts
    data["backbone"]["path"] = str(tmp_path / "2.1")
    with pytest.raises(RecipeError) as refused:
        recipe_from_dict(data)
    assert "[backbone.max_sequence_length] must be 512" in str(refused.value)
    assert "[backbone.expert] 'low' needs a two-expert" in str(refused.value)


@pytest.mark.parametrize("expert", ["high", "low"])
def test_lora_trains_the_chosen_expert_alone(expert: str) -> None:
    from flowrl.config.settings import LoraConfig
    from flowrl.trainer.lora import add_lora

    recipe = recipe_from_dict({**tiny_recipe(), "backbone": settings("2.2-a14b", expert=expert), "lora": {"rank": 2}})
    assert recipe.lora.target_modules == ("to_q", "to_k", "to_v", "to_out.0")  # Wan's: self- and cross-attention
    backbone = flowrl.build("backbone", settings("2.2-a14b", expert=expert))
    trained = backbone.pipe.transformer if expert == "high" else backbone.pipe.transformer_2
    frozen = backbone.pipe.transformer_2 if expert == "high" else backbone.pipe.transformer
    assert backbone.transformer is trained and backbone.module is trained
    add_lora(backbone.transformer, LoraConfig(rank=2, alpha=2.0, target_modules=recipe.lora.target_modules))
    assert not any("lora_" in n for n, _ in frozen.named_parameters())
    cond = backbone.encode(_prompts(_frames(2, 16)))
    x = backbone.noise(2, torch.Generator().manual_seed(4))
    for s, reaches in ((torch.tensor([0.95, 0.95]), expert == "high"), (torch.tensor([0.3, 0.3]), expert == "low")):
        trained.zero_grad()
        v = backbone.velocity(x, s, cond)
        if reaches:
            v.square().sum().backward()
            grads = [p.grad for p in trained.parameters() if p.requires_grad]
            assert grads and all(g is not None for g in grads)
        else:  # steps on the frozen expert's side: a zero gradient (the loss still backpropagates)
            v.square().sum().backward()
            assert all(p.grad is None for p in trained.parameters())


def test_conforms_with_first_frames() -> None:
    for variant in VARIANTS:
        size = SIZES[variant]
        check_backbone(lambda v=variant: flowrl.build("backbone", settings(v)), _prompts(_frames(2, size)))


def test_probe_measures_the_video_rows() -> None:
    """AEGPO's probe leaves the velocity unchanged; Wan 2.1's text keys are measured apart from its image context;
    TI2V's first latent frame (the image) is not a measured row."""
    from flowrl.backbones.common.probe_options import AttentionEntropyOptions
    from flowrl.backbones.wan.probe import entropy_probe

    for variant, keys in (("2.1", "text"), ("2.1", "all"), ("2.2-a14b", "all"), ("2.2-ti2v", "all")):
        backbone = flowrl.build("backbone", settings(variant))
        cond = backbone.encode(_prompts(_frames(2, SIZES[variant])))
        x = backbone.noise(2, torch.Generator().manual_seed(5))
        s = torch.tensor([0.95, 0.5])
        options = AttentionEntropyOptions(keys=keys)
        with torch.no_grad():
            v, entropy = backbone.velocity_and_entropy(x, s, cond, options)
            assert torch.equal(v, backbone.velocity(x, s, cond))
        assert entropy.shape == (2,) and torch.isfinite(entropy).all() and (entropy >= 0).all()
        if variant == "2.2-ti2v":
            with torch.no_grad(), entropy_probe(backbone.module, options) as recorder:
                backbone.velocity(x, s, cond)
            assert not torch.allclose(entropy, recorder.entropy()[-2:], atol=1e-4)  # every row: another figure


def test_memory_precheck_counts_frames_and_the_cached_condition() -> None:
    from flowrl.trainer.memory import condition_bytes, picture_pixels

    backbone = flowrl.build("backbone", settings("2.1", num_frames=9))
    assert picture_pixels(backbone) == 9 * 16 * 16  # every decoded frame, not one picture
    z, f, h, w = backbone.latent_shape
    clip = (32 // 8) ** 2 + 1  # the tiny CLIP's tokens (and its class token), 8 wide
    assert condition_bytes(backbone) == 4 * ((z + 4) * f * h * w + clip * 8)
    cond = backbone.encode(_prompts(_frames(2, 16)))
    held = sum(t[0].numel() for k, t in cond.tensors.items() if k != "embeds")
    assert condition_bytes(backbone) == 4 * held


SMOKE = ROOT / "recipes" / "smoke" / "wan_i2v.toml"


def test_smoke_recipe_validates() -> None:
    command = [sys.executable, "-m", "flowrl.cli.main", "validate", str(SMOKE)]
    out = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr


def test_smoke_recipe_trains_two_iterations(tmp_path) -> None:
    """The frame-averaged JPEG reward and the first-frame consistency reward on the world's rendered first frames."""
    from flowrl.config.recipe import load_recipe
    from flowrl.trainer.loop import Trainer

    trainer = Trainer(load_recipe(SMOKE), tmp_path, quiet=True)
    try:
        for _ in range(2):
            metrics = trainer.iteration()
            assert math.isfinite(metrics["loss"]) and metrics["nfe"] > 0
            assert math.isfinite(metrics["reward/jpeg_compressibility"])
            assert 0.0 <= metrics["reward/first_frame_consistency"] <= 1.0
    finally:
        trainer.logger.close()
        trainer.release()


def test_two_expert_training_with_steps_on_both_sides(tmp_path, capsys) -> None:
    """Wan 2.2 A14B with the high-noise expert trained: a step on each side of the boundary (t 1000 and 750 of the
    4-step grid, boundary 800) trains one iteration; the LoRA moves, the frozen expert does not, and the step on the
    frozen side is reported once."""
    from flowrl.trainer.loop import Trainer

    data = tiny_recipe()
    data["backbone"] = settings("2.2-a14b", resolution=32, boundary_ratio=0.8, grid="uniform")
    data["prompts"] = {"type": "world_edit", "eval_count": 2}
    data["selector"] = {"type": "explicit", "units": [[0, 1], [2, 1]]}
    data["lora"] = {"rank": 2, "alpha": 2.0}
    data["optim"] = {"lr": 1e-2}
    data["trainer"]["eval_every"] = 0
    trainer = Trainer(recipe_from_dict(data), tmp_path, quiet=True)
    try:
        backbone = trainer.parts.backbone
        frozen = {k: v.clone() for k, v in backbone.pipe.transformer_2.state_dict().items()}
        lora = {n: p.detach().clone() for n, p in backbone.transformer.named_parameters() if p.requires_grad}
        metrics = trainer.iteration()
        assert math.isfinite(metrics["loss"]) and math.isfinite(metrics["grad_norm"])
        moved = [n for n, p in backbone.transformer.named_parameters() if p.requires_grad and
                 not torch.equal(p.detach(), lora[n])]
        assert moved and all("lora_" in n for n in moved)
        assert all(torch.equal(v, frozen[k]) for k, v in backbone.pipe.transformer_2.state_dict().items())
    finally:
        trainer.logger.close()
        trainer.release()
    assert capsys.readouterr().err.count("run on the frozen expert") <= 1


def test_probe_text_keys_leave_out_wan21_image_context() -> None:
    """keys = "text" on Wan 2.1 I2V: the first block's cross-attention entropy over the 512 text tokens only,
    recomputed by hand from the block's inputs, and not the one over the whole [image; text] context."""
    from diffusers.models.transformers.transformer_wan import _get_qkv_projections

    from flowrl.backbones.common.probe import softmax_entropy
    from flowrl.backbones.common.probe_options import AttentionEntropyOptions

    backbone = flowrl.build("backbone", settings("2.1", guidance_scale=1.0))
    cond = backbone.encode(_prompts(_frames(2, 16)))
    x = backbone.noise(2, torch.Generator().manual_seed(6))
    s = torch.tensor([0.7, 0.4])
    attn = backbone.transformer.blocks[0].attn2
    seen: dict[str, torch.Tensor] = {}
    hook = attn.register_forward_pre_hook(lambda _m, args: seen.update(h=args[0], c=args[1]))  # (hidden, context)
    with torch.no_grad():
        _, entropy = backbone.velocity_and_entropy(x, s, cond, AttentionEntropyOptions(keys="text", layers=(0,)))
    hook.remove()
    context = seen["c"]
    assert context.shape[1] == (32 // 8) ** 2 + 1 + 512  # the CLIP tokens, then the text

    def by_hand(keys_from: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            q, k, _ = _get_qkv_projections(attn, seen["h"], keys_from)
            q = attn.norm_q(q).unflatten(2, (attn.heads, -1))
            k = attn.norm_k(k).unflatten(2, (attn.heads, -1))
            return softmax_entropy(q, k, 1024, False)

    assert torch.allclose(entropy, by_hand(context[:, -512:]), rtol=1e-5)
    assert not torch.allclose(entropy, by_hand(context), rtol=1e-3)  # the image context counted: another figure
