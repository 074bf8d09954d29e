"""The Wan adapter on the tiny twin: WanPipeline equivalence (both grids, with and without CFG, Wan 2.2 TI2V's
per-token timesteps), video latents and frame rules, the timestep scale, the text padding, the flow shift, decode
against the pipeline's, NFE, the frozen negative branch, the embedding cache, loading a saved folder, the refused
second expert, LoRA targets, gradient checkpointing, FSDP units and a 2-iteration train on a rollout tree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest
import torch
from conftest import ROOT, tiny_recipe
from diffusers import FlowMatchEulerDiscreteScheduler

import flowrl
from flowrl.config.recipe import RecipeError, load_recipe, recipe_from_dict
from flowrl.config.settings import LoraConfig
from flowrl.core.schedule import shifted_sigmas
from flowrl.core.types import Plan, Schedule
from flowrl.parts.samplers.walk import walk
from flowrl.trainer.loop import Trainer
from flowrl.trainer.lora import add_lora
from flowrl.trainer.sharding import sharding_units

PROMPTS = ["a red circle", "two blue squares", "a cat on a table"]


def _backbone(**options: object) -> Any:
    return flowrl.build("backbone", {"type": "tiny_wan", "resolution": 16, **options})


def _ode(backbone: Any, steps: int, x1: torch.Tensor, shift: float = 3.0) -> torch.Tensor:
    schedule = Schedule(backbone.schedule_sigmas(steps, shift), flowrl.build("kernel", {"type": "ode"}))
    with torch.no_grad():
        cond = backbone.encode(PROMPTS)
        return walk(backbone, x1, cond, torch.arange(len(PROMPTS)), 0, Plan((), ()), schedule, None)


class UniformGrid(FlowMatchEulerDiscreteScheduler):
    """WanPipeline takes no ``sigmas``: this scheduler walks flowrl's uniform grid, ``linspace(1, 1/N, N)`` shifted."""

    def set_timesteps(self, num_inference_steps: int | None = None, device: Any = None, **_: Any) -> None:
        n = int(num_inference_steps or 1)
        super().set_timesteps(sigmas=list(np.linspace(1.0, 1 / n, n)), device=device)


def _pipeline(backbone: Any, x1: torch.Tensor, steps: int, grid: str, shift: float = 3.0, **call: Any) -> torch.Tensor:
    backbone.pipe.scheduler = (UniformGrid if grid == "uniform" else FlowMatchEulerDiscreteScheduler)(shift=shift)
    with torch.no_grad():
        return backbone.pipe(  # type: ignore[no-any-return]
            prompt=PROMPTS,
            latents=x1.clone(),
            num_inference_steps=steps,
            height=backbone.height,
            width=backbone.width,
            num_frames=backbone.config.num_frames,
            guidance_scale=backbone.config.guidance_scale,
            max_sequence_length=backbone.config.max_sequence_length,
            **call,
        ).frames


@pytest.mark.parametrize("guidance_scale", [1.0, 4.5])
@pytest.mark.parametrize("grid", ["uniform", "diffusers"])
def test_all_ode_plan_matches_wan_pipeline(guidance_scale: float, grid: str) -> None:
    backbone = _backbone(width=32, num_frames=5, guidance_scale=guidance_scale, grid=grid)
    steps = 5
    x1 = backbone.noise(len(PROMPTS), torch.Generator().manual_seed(1))
    ours = _ode(backbone, steps, x1)
    theirs = _pipeline(backbone, x1, steps, grid, output_type="latent")
    assert ours.shape == theirs.shape == (3, 4, 2, 4, 8)  # [B, C, (5 - 1) / 4 + 1, 16 / 4, 32 / 4]
    # not bitwise: with CFG flowrl runs [uncond; cond] as one batch of 6, the pipeline two forwards of 3, and the
    # uniform grid reaches the pipeline as a list of sigmas; measured up to 2.1e-6 on latents of ~4 (0 without
    # CFG on the pipeline's own grid): 1e-5 of the latents' scale leaves a margin of about 20
    assert (ours - theirs).abs().max() <= 1e-5 * theirs.abs().max()
    assert ours.std() > 0.1


def test_flow_shift_grids_and_parity_at_shift_5() -> None:
    """The static shift is the recipe's: uniform = flowrl's shifted grid, diffusers = the scheduler's own; 720p's 5."""
    backbone = _backbone(grid="diffusers")
    for shift in (3.0, 5.0):
        scheduler = FlowMatchEulerDiscreteScheduler(shift=shift)
        scheduler.set_timesteps(6)
        assert backbone.schedule_sigmas(6, shift) == tuple(float(s) for s in scheduler.sigmas)
        assert _backbone().schedule_sigmas(6, shift) == tuple(float(s) for s in shifted_sigmas(6, shift))
    assert backbone.schedule_sigmas(6, 5.0)[3] > backbone.schedule_sigmas(6, 3.0)[3] + 0.05
    x1 = backbone.noise(3, torch.Generator().manual_seed(2))
    ours = _ode(backbone, 4, x1, shift=5.0)
    theirs = _pipeline(backbone, x1, 4, "diffusers", shift=5.0, output_type="latent")
    assert (ours - theirs).abs().max() <= 1e-5 * theirs.abs().max()  # as above (measured 1.1e-6 on latents of ~3.5)


def test_ti2v_per_token_timesteps_match_the_pipeline() -> None:
    """Wan 2.2 TI2V (expand_timesteps): one timestep per latent token, as WanPipeline passes it."""
    backbone = _backbone(width=32, num_frames=5)
    x1 = backbone.noise(3, torch.Generator().manual_seed(3))
    plain = _ode(backbone, 3, x1)
    backbone.pipe.register_to_config(expand_timesteps=True)
    seen: list[tuple[int, ...]] = []
    hook = backbone.transformer.register_forward_pre_hook(
        lambda _m, _a, kw: seen.append(tuple(kw["timestep"].shape)), with_kwargs=True
    )
    expanded = _ode(backbone, 3, x1)
    theirs = _pipeline(backbone, x1, 3, "uniform", output_type="latent")
    hook.remove()
    assert seen[0] == (6, 2 * 2 * 4)  # [uncond; cond] rows x (2 latent frames x 2 x 4 tokens)
    assert (expanded - theirs).abs().max() <= 1e-5 * theirs.abs().max()  # measured 4.3e-6 on latents of ~4.7
    assert (expanded - plain).abs().max() <= 1e-5 * plain.abs().max()  # every token has the step's t (1.3e-6)


def test_video_latents_frames_and_decode_match_the_pipeline() -> None:
    for frames, latent_frames in ((1, 1), (5, 2), (9, 3)):
        assert _backbone(num_frames=frames).latent_shape == (4, latent_frames, 4, 4)
    backbone = _backbone(width=32, num_frames=5, guidance_scale=1.0)
    x1 = backbone.noise(3, torch.Generator().manual_seed(4))
    ours = backbone.decode(_ode(backbone, 2, x1))
    theirs = _pipeline(backbone, x1, 2, "uniform", output_type="pt")  # (B, F, 3, H, W) in [0, 1]
    assert ours.shape == theirs.shape == (3, 5, 3, 16, 32)
    assert (ours - theirs).abs().max() <= 1e-5  # measured 0: the same VAE call on the same latents
    assert float(ours.std()) > 0.01
    image_mode = _backbone(num_frames=1)
    assert image_mode.decode(image_mode.noise(2, torch.Generator().manual_seed(0))).shape == (2, 3, 16, 16)
    data = tiny_recipe()
    data["backbone"] = {"type": "tiny_wan", "num_frames": 4}
    with pytest.raises(RecipeError, match=r"backbone\.num_frames.*divisible by 4"):
        recipe_from_dict(data)


def test_timestep_stays_in_0_1000_and_text_is_padded_like_the_pipeline() -> None:
    backbone = _backbone(guidance_scale=1.0)
    seen: list[torch.Tensor] = []
    hook = backbone.transformer.register_forward_pre_hook(
        lambda _m, _a, kw: seen.append(kw["timestep"].clone()), with_kwargs=True
    )
    x = backbone.noise(2, torch.Generator().manual_seed(0))
    with torch.no_grad():
        backbone.velocity(x, torch.tensor([0.25, 0.9]), backbone.encode(PROMPTS[:2]))
    hook.remove()
    torch.testing.assert_close(seen[0], torch.tensor([250.0, 900.0]))
    embeds = backbone.encode(PROMPTS).tensors["embeds"]
    assert embeds.shape == (3, 16, 16)  # padded to max_sequence_length
    lengths = backbone.pipe.tokenizer(PROMPTS, padding="max_length", max_length=16).attention_mask
    for row, mask in zip(embeds, lengths, strict=True):
        n = sum(mask)
        assert float(row[n:].abs().max()) == 0.0 and float(row[:n].abs().min(-1).values.max()) > 0
    with torch.no_grad():
        theirs = backbone.pipe._get_t5_prompt_embeds(PROMPTS, max_sequence_length=16)
    assert torch.equal(embeds, theirs)  # the pipeline's own encoding, exactly


def test_nfe_counts_two_rows_per_guided_step() -> None:
    from flowrl.evaluation.evaluate import ode_images

    for scale, per_row in ((4.5, 2), (1.0, 1)):
        backbone = _backbone(guidance_scale=scale)
        schedule = Schedule(backbone.schedule_sigmas(3, 3.0), flowrl.build("kernel", {"type": "ode"}))
        ode_images(backbone, ["a", "b"], schedule, seed=0)
        assert backbone.nfe == 2 * 3 * per_row


def test_negative_branch_is_frozen_and_embeddings_are_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    """With grad on, d v / d theta = scale * d v_cond / d theta; each prompt (and the negative) encoded once."""
    backbone = _backbone(guidance_scale=3.0)
    calls: list[list[str]] = []
    original = backbone.pipe.encode_prompt

    def counting(*args: object, **kwargs: Any) -> Any:
        calls.append(list(kwargs["prompt"]))
        return original(*args, **kwargs)

    monkeypatch.setattr(backbone.pipe, "encode_prompt", counting)
    backbone.transformer.requires_grad_(True)
    x = backbone.noise(2, torch.Generator().manual_seed(0))
    s = torch.tensor([0.8, 0.4])
    cond = backbone.encode(["a cat", "a dog", "a cat"]).take(torch.tensor([0, 1]))
    with torch.no_grad():
        batched = backbone.velocity(x, s, cond)  # rollout path: one [uncond; cond] forward
    v = backbone.velocity(x, s, cond)  # training path: separate forwards
    assert calls == [["a cat", "a dog"], [""]]
    torch.testing.assert_close(v, batched, atol=1e-5, rtol=1e-5)
    params = list(backbone.transformer.parameters())
    grads = torch.autograd.grad(v.square().sum(), params, allow_unused=True)
    v_cond = backbone._forward(x, s * 1000, cond.tensors["embeds"])
    expected = torch.autograd.grad((3.0 * v_cond * 2 * v.detach()).sum(), params, allow_unused=True)
    for got, want in zip(grads, expected, strict=True):
        if want is None:
            assert got is None or float(got.abs().max()) == 0
        else:
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_wan_loads_a_saved_folder_refuses_a_second_expert_and_fails_clearly_offline(tmp_path: Path) -> None:
    from flowrl.backbones.wan.adapter import WanFromPretrained
    from flowrl.backbones.wan.tiny import TinyWanSpec, save_tiny_wan, tiny_wan_pipeline

    save_tiny_wan(TinyWanSpec(), tmp_path / "model")
    settings = {"type": "wan", "path": str(tmp_path / "model"), "resolution": 16, "num_frames": 5,
                "max_sequence_length": 16, "guidance_scale": 4.5, "dtype": "float32"}
    loaded = flowrl.build("backbone", settings)
    built = _backbone(num_frames=5)
    x1 = loaded.noise(3, torch.Generator().manual_seed(0))
    assert torch.equal(_ode(loaded, 2, x1), _ode(built, 2, x1))  # exact: the same weights and code, one process
    pipe = tiny_wan_pipeline(TinyWanSpec(), seed=0)
    pipe.register_modules(transformer_2=pipe.transformer)
    pipe.register_to_config(boundary_ratio=0.875)
    pipe.save_pretrained(tmp_path / "a14b", safe_serialization=True)
    two = WanFromPretrained.Config(path=str(tmp_path / "a14b"), resolution=16, num_frames=5)
    assert [key for key, _ in WanFromPretrained.check_config(two)] == ["path"]
    with pytest.raises(ValueError, match=r"two-expert Wan 2\.2 pipeline \(transformer_2, boundary_ratio = 0\.875\)"):
        flowrl.build("backbone", {**settings, "path": str(tmp_path / "a14b")})
    with pytest.raises(OSError, match="cannot load WanPipeline from hub id"):
        flowrl.build("backbone", {"type": "wan", "path": "nobody/no-such-wan-xyz"})
    problems = WanFromPretrained.check_config(WanFromPretrained.Config(path="x", resolution=200, num_frames=6))
    assert sorted(key for key, _ in problems) == ["num_frames", "resolution", "resolution"]


def test_lora_targets_gradient_checkpointing_and_fsdp_units() -> None:
    backbone = _backbone(guidance_scale=1.0)
    transformer = backbone.transformer
    layers = {n for n, m in transformer.named_modules() if isinstance(m, torch.nn.Linear)}
    for target in backbone.lora_targets:  # each published target selects a layer, in attn1 and attn2
        for attn in ("attn1", "attn2"):
            assert any(n.endswith(f"{attn}.{target}") for n in layers), (target, attn)
    add_lora(transformer, LoraConfig(rank=4, target_modules=backbone.lora_targets))
    adapted = {n.rsplit(".lora_A", 1)[0] for n, _ in transformer.named_parameters() if ".lora_A" in n}
    assert len(adapted) == 2 * 2 * 4  # blocks x (attn1, attn2) x 4 projections
    x = backbone.noise(2, torch.Generator().manual_seed(0))
    s, cond = torch.tensor([0.7, 0.3]), backbone.encode(PROMPTS[:2])
    plain = backbone.velocity(x, s, cond)
    transformer.enable_gradient_checkpointing()
    assert transformer.is_gradient_checkpointing
    v = backbone.velocity(x, s, cond)
    torch.testing.assert_close(v, plain)  # the same forward, recomputed on backward
    v.square().mean().backward()
    assert sum(float(p.grad.abs().sum()) for p in transformer.parameters() if p.grad is not None) > 0
    units = sharding_units(transformer)
    assert [type(u).__name__ for u in units] == ["WanTransformerBlock"] * 2 and units[0] is transformer.blocks[0]


def test_bfloat16_trains_lora_with_fp32_velocities() -> None:
    """bf16 transformer weights, fp32 LoRA weights, autocast: fp32 velocities near the float32 model's."""
    reference = _backbone(num_frames=5)
    backbone = _backbone(num_frames=5, dtype="bfloat16")
    add_lora(backbone.transformer, LoraConfig(rank=4, target_modules=backbone.lora_targets))
    assert {p.dtype for p in backbone.transformer.parameters() if not p.requires_grad} == {torch.bfloat16}
    trained = [p for p in backbone.transformer.parameters() if p.requires_grad]
    for p in trained:  # what the trainer does
        p.data = p.data.float()
    x, s = backbone.noise(2, torch.Generator().manual_seed(0)), torch.tensor([0.9, 0.3])
    v = backbone.velocity(x, s, backbone.encode(PROMPTS[:2]))
    with torch.no_grad():
        v32 = reference.velocity(x, s, reference.encode(PROMPTS[:2]))
    assert v.dtype == torch.float32 and bool(torch.isfinite(v).all())
    # bf16 keeps 8 bits of mantissa: measured 3.0e-2 of the velocity's scale (0.057 on 1.9) with CFG 4.5, which
    # multiplies the branches' rounding; 0.1 leaves a margin of about 3 and still fails on a wrong dtype path
    assert float((v.detach() - v32).abs().max()) <= 0.1 * float(v32.abs().max())
    v.square().mean().backward()
    assert sum(float(p.grad.abs().sum()) for p in trained if p.grad is not None) > 0


def _train(guidance_scale: float, tmp: Path) -> list[dict[str, Any]]:
    data = tiny_recipe(gradient_checkpointing=True)
    data["backbone"] = {"type": "tiny_wan", "num_frames": 5, "num_layers": 1, "guidance_scale": guidance_scale}
    data["selector"] = {"type": "egrpo_entropy", "units": [[0, 1], [1, 1]]}  # E-GRPO's tree form
    data["sampler"] = {"type": "branch_tree", "factor": 2}
    data["advantage"] = {"type": "branch_depthwise", "node_reward": "leaf_mean"}
    data["lora"] = {"rank": 4}
    trainer = Trainer(recipe_from_dict(data), tmp, quiet=True)
    assert trainer.backbone.transformer.is_gradient_checkpointing
    trainer.run()
    return [json.loads(line) for line in (tmp / "metrics.jsonl").read_text().splitlines()]


def test_trainer_runs_wan_clips_on_a_rollout_tree(tmp_path: Path) -> None:
    rows = _train(4.5, tmp_path / "guided")
    assert len(rows) == 2 and all(np.isfinite(r["loss"]) and r["grad_norm"] > 0 for r in rows)
    assert abs(rows[0]["ratio_mean"] - 1) < 1e-6
    per_prompt = sum(2 ** sum(1 for split in (0, 1) if split < t) for t in range(4))  # tree nodes per step
    assert [r["nfe"] for r in rows] == [2 * 2 * per_prompt, 4 * 2 * per_prompt]  # prompts x nodes x 2 rows (CFG)


def test_smoke_and_gpu_recipes_validate() -> None:
    from flowrl.cli.main import main as flowrl_main

    smoke = load_recipe(ROOT / "recipes" / "smoke" / "wan.toml")
    assert smoke.parts["backbone"].type == "tiny_wan"
    for path in sorted((ROOT / "recipes" / "wan").glob("*.toml")):
        assert flowrl_main(["validate", str(path)]) == 0, path


@pytest.mark.slow
def test_smoke_recipe_trains(tmp_path: Path) -> None:
    from flowrl.cli.main import main as flowrl_main

    recipe = str(ROOT / "recipes" / "smoke" / "wan.toml")
    assert flowrl_main(["train", recipe, "--output-dir", str(tmp_path / "run"), "--quiet"]) == 0
    rows = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert sum(1 for row in rows if '"grad_norm"' in row) == 20  # every iteration of the recipe


# -- AEGPO's attention-entropy probe (flowrl.backbones.wan.probe) ---------------------------------------
def test_pinned_diffusers_internals() -> None:
    """The probe subclasses WanAttnProcessor of diffusers 0.42 and imports one private helper."""
    import inspect

    import diffusers
    from diffusers.models.transformers.transformer_wan import WanAttnProcessor, _get_qkv_projections

    from flowrl.backbones.wan.probe import WanEntropyProbeProcessor

    assert diffusers.__version__.startswith("0.42.")
    helper = list(inspect.signature(_get_qkv_projections).parameters)
    assert helper == ["attn", "hidden_states", "encoder_hidden_states"]
    call = list(inspect.signature(WanAttnProcessor.__call__).parameters)
    assert call == list(inspect.signature(WanEntropyProbeProcessor.__call__).parameters)


@pytest.mark.parametrize("keys", ["all", "text"])
def test_probe_entropy_is_the_explicit_softmax_of_the_layer_it_reads(keys: Literal["all", "text"]) -> None:
    """Layer 0's queries and keys as the probe builds them reproduce the layer's own output through an explicit
    softmax (so they are the model's), and the probe's entropy is that softmax's; the velocity is unchanged."""
    from diffusers.models.transformers.transformer_wan import _get_qkv_projections

    from flowrl.backbones.common.probe_options import AttentionEntropyOptions
    from flowrl.backbones.wan.probe import rotate

    backbone = _backbone(width=32, num_frames=5, guidance_scale=4.5)
    attn = backbone.transformer.blocks[0].attn1 if keys == "all" else backbone.transformer.blocks[0].attn2
    seen: dict[str, Any] = {}
    hook = attn.register_forward_hook(lambda _m, args, out: seen.update(args=args, out=out))
    x = backbone.noise(3, torch.Generator().manual_seed(5))
    s, cond = torch.tensor([0.9, 0.5, 0.2]), backbone.encode(PROMPTS)
    with torch.no_grad():
        v = backbone.velocity(x, s, cond)
        probed, entropy = backbone.velocity_and_entropy(x, s, cond, AttentionEntropyOptions(keys=keys, layers=(0,)))
        hook.remove()
        hidden, context, _, rotary = (*seen["args"], None, None, None)[:4]
        query, key, value = _get_qkv_projections(attn, hidden, context)
        query, key = attn.norm_q(query).unflatten(2, (2, -1)), attn.norm_k(key).unflatten(2, (2, -1))
        if rotary is not None:
            query, key = rotate(query, *rotary), rotate(key, *rotary)
        p = torch.softmax(torch.einsum("bqhd,bkhd->bhqk", query, key) / 12**0.5, dim=-1)
        out = attn.to_out[0](torch.einsum("bhqk,bkhd->bqhd", p, value.unflatten(2, (2, -1))).flatten(2))
    assert torch.equal(probed, v) and backbone.nfe == 4 * 3  # two guided calls, 2 rows each
    # explicit against fused attention: float32 rounding only (measured 1.2e-7 on outputs up to 0.7)
    torch.testing.assert_close(out, seen["out"], atol=1e-5, rtol=1e-4)
    explicit = -(p * p.clamp_min(1e-30).log()).sum(-1).mean((1, 2))
    torch.testing.assert_close(entropy, explicit[3:], atol=1e-5, rtol=1e-5)  # the conditional rows of [uncond; cond]
    # 16 keys either way (2 x 2 x 4 video tokens, or max_sequence_length prompt tokens): 0 < H < log 16
    assert bool((entropy > 0).all()) and bool((entropy < torch.log(torch.tensor(16.0))).all())
    assert {type(b.attn1.processor).__name__ for b in backbone.transformer.blocks} == {"WanAttnProcessor"}


def test_aegpo_recipe_shape_trains_on_tiny_wan(tmp_path: Path) -> None:
    """AEGPO over DanceGRPO (recipes/wan/aegpo_dance_hps.toml's parts) for 2 iterations on the tiny twin."""
    import tomllib

    data = tomllib.loads((ROOT / "recipes" / "wan" / "aegpo_dance_hps.toml").read_text())
    data.update({key: value for key, value in tiny_recipe().items() if key in ("prompts", "reward")})
    data["backbone"] = {"type": "tiny_wan", "num_frames": 1, "num_layers": 1, "guidance_scale": 1.0}
    data["schedule"] = {"num_steps": 4, "shift": 3.0}
    data["selector"].update(k=2)
    data["selector"]["attention"]["query_stride"] = 1
    data["sampler"].update(min_group=2, max_group=6)
    data["sampler"]["host"]["group_size"] = 4
    data["trainer"] = {"max_steps": 2, "prompts_per_step": 2, "checkpoint_every": 0, "image_every": 0}
    Trainer(recipe_from_dict(data), tmp_path / "run", quiet=True).run()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["grad_norm"] > 0 and np.isfinite(r["loss"]) for r in rows)
