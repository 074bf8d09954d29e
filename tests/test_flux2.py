"""The FLUX.2 adapter on tiny real pipelines: parity with Flux2KleinPipeline (klein-base with CFG, distilled klein)
and Flux2Pipeline (dev, embedded guidance), the mu-shifted sigma grid, the 4-D ids and the latent packing and
normalisation, NFE, the frozen negative branch, the prompt cache, loading a saved folder, LoRA on the base's
targets, gradient checkpointing, FSDP units, the attention-entropy probe and a 2-iteration E-GRPO train."""

from __future__ import annotations

import tempfile
import tomllib
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest
import torch
from conftest import ROOT, tiny_recipe

import flowrl
from flowrl.backbones.flux2.adapter import BASE_TARGETS, Flux2Adapter, single_block_outputs
from flowrl.backbones.flux2.tiny import TinyFlux2, TinyFlux2Spec, save_tiny_flux2
from flowrl.backbones.lora.targets import ADAPTABLE, matches, on_meta
from flowrl.config.recipe import RecipeError, load_recipe, recipe_from_dict
from flowrl.config.settings import LoraConfig
from flowrl.core.types import Plan, Schedule
from flowrl.parts.samplers.walk import walk
from flowrl.trainer.loop import Trainer
from flowrl.trainer.lora import add_lora
from flowrl.trainer.sharding import sharding_units

PROMPTS = ["a red circle", "two blue squares", "a cat on a tree"]
# (variant, distilled, guidance_scale): klein-base with CFG and without (scale 1), the distilled klein, dev
CASES = [("klein", False, 4.0), ("klein", False, 1.0), ("klein", True, 4.0), ("dev", False, 3.5)]


def _backbone(**options: object) -> Flux2Adapter:
    return flowrl.build("backbone", {"type": "tiny_flux2", "resolution": 32, **options})  # type: ignore[return-value]


def _ode(backbone: Flux2Adapter, steps: int, x1: torch.Tensor, prompts: list[str] = PROMPTS) -> torch.Tensor:
    schedule = Schedule(backbone.schedule_sigmas(steps, 3.0), flowrl.build("kernel", {"type": "ode"}))
    with torch.no_grad():
        cond = backbone.encode(prompts)
        return walk(backbone, x1, cond, torch.arange(len(prompts)), 0, Plan((), ()), schedule, None)


def _maps(backbone: Flux2Adapter, tokens: torch.Tensor) -> torch.Tensor:
    """Tokens ``[B, seq, C]`` as the pipeline's ``latents`` argument ``[B, C, h, w]`` (it packs them itself)."""
    return tokens.transpose(1, 2).reshape(tokens.shape[0], -1, backbone.side, backbone.side)


@pytest.mark.parametrize(("variant", "distilled", "scale"), CASES)
@pytest.mark.parametrize("grid", ["diffusers", "uniform"])
def test_ode_rollout_matches_the_pipeline(variant: str, distilled: bool, scale: float, grid: str) -> None:
    backbone = _backbone(variant=variant, distilled=distilled, guidance_scale=scale, grid=grid)
    steps = 5
    x1 = backbone.noise(len(PROMPTS), torch.Generator().manual_seed(1))
    ours = _ode(backbone, steps, x1)
    # "diffusers": the pipeline's own grid; "uniform": flowrl's grid handed to the pipeline as sigmas (the
    # pipeline still applies its mu shift to them, so it is the mu-shifted grid that is compared then)
    sigmas = None
    if grid == "uniform":
        sigmas = list(np.asarray(backbone.schedule_sigmas(steps, 3.0))[:-1])
        shifted = backbone.pipe.scheduler.time_shift
        backbone.pipe.scheduler.time_shift = lambda mu, sigma, t: t  # the pipeline's grid = the given sigmas
    with torch.no_grad():
        theirs = backbone.pipe(
            prompt=PROMPTS,
            latents=_maps(backbone, x1),
            num_inference_steps=steps,
            sigmas=sigmas,
            height=32,
            width=32,
            guidance_scale=scale,
            max_sequence_length=backbone.config.max_sequence_length,
            output_type="latent",
        ).images
    if grid == "uniform":
        backbone.pipe.scheduler.time_shift = shifted
    # klein returns the VAE's latent maps (unpacked, de-normalised, unpatchified); dev the packed tokens
    ours = backbone.latents_from_tokens(ours) if variant == "klein" else ours
    assert ours.shape == theirs.shape
    # exact without CFG (the same forwards in the same order); with CFG flowrl batches [negative; cond] in one
    # forward where the pipeline runs two, which moves the result by 1.5e-6 (measured) on latents of ~4.2: a
    # tolerance of 1e-5 of the latents' scale is 25x that
    tolerance = 1e-5 * float(theirs.abs().max()) if backbone.guided else 0.0
    assert float((ours - theirs).abs().max()) <= tolerance
    assert ours.std() > 0.1


def test_sigma_grid_is_the_pipelines_mu_shifted_one() -> None:
    from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu

    backbone = _backbone()
    tokens = backbone.side**2
    for steps in (4, 16, 50):
        grid = np.asarray(backbone.schedule_sigmas(steps, 3.0))
        u = np.linspace(1.0, 1 / steps, steps)
        mu = compute_empirical_mu(tokens, steps)
        expected = np.exp(mu) / (np.exp(mu) + (1 / u - 1))  # the exponential time shift of every released config
        assert grid[-1] == 0.0 and len(grid) == steps + 1
        np.testing.assert_allclose(grid[:-1], expected, rtol=1e-6)  # float32 grid of values in (0, 1]
    # mu depends on the step count: the same relative position gets another level
    assert backbone.schedule_sigmas(4, 3.0)[2] != pytest.approx(backbone.schedule_sigmas(8, 3.0)[4], abs=1e-3)
    # uniform: flowrl's shifted grid, the shift taken from the recipe
    from flowrl.core.schedule import shifted_sigmas

    uniform = _backbone(grid="uniform").schedule_sigmas(6, 3.0)
    assert uniform == tuple(float(s) for s in shifted_sigmas(6, 3.0))


def test_position_ids_timestep_and_guidance_inputs() -> None:
    backbone = _backbone(variant="dev", guidance_scale=3.5)
    cond = backbone.encode(PROMPTS[:2])
    img, txt = backbone._img_ids, backbone._text_ids
    assert img is not None and txt is not None
    side, length = backbone.side, backbone.config.max_sequence_length
    assert img.shape == (1, side * side, 4) and txt.shape == (1, length, 4)  # (t, h, w, l), a batch dimension
    assert torch.equal(img[0, :, 1] * side + img[0, :, 2], torch.arange(side * side))  # row-major (h, w)
    assert not img[0, :, [0, 3]].any() and not txt[0, :, :3].any()
    assert torch.equal(txt[0, :, 3], torch.arange(length))
    seen: dict[str, torch.Tensor] = {}

    def spy(module: object, args: object, kwargs: dict) -> None:
        seen.update({k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor)})

    handle = backbone.transformer.register_forward_pre_hook(spy, with_kwargs=True)
    x = backbone.noise(2, torch.Generator().manual_seed(0))
    with torch.no_grad():
        v35 = backbone.velocity(x, torch.tensor([0.75, 0.25]), cond)
    handle.remove()
    assert seen["img_ids"].shape == (2, side * side, 4) and seen["txt_ids"].shape == (2, length, 4)
    assert torch.equal(seen["timestep"], torch.tensor([0.75, 0.25]))  # t in [0, 1]
    assert torch.equal(seen["guidance"], torch.tensor([3.5, 3.5]))  # dev's embedded guidance
    other = _backbone(variant="dev", guidance_scale=1.0)
    with torch.no_grad():
        v1 = other.velocity(x, torch.tensor([0.75, 0.25]), other.encode(PROMPTS[:2]))
    assert float((v35 - v1).abs().max()) > 1e-3  # the guidance embedder is live
    # klein: guidance=None always; the distilled one ignores guidance_scale
    distilled = [_backbone(distilled=True, guidance_scale=g) for g in (1.0, 6.0)]
    with torch.no_grad():
        a, b = (d.velocity(x, torch.tensor([0.75, 0.25]), d.encode(PROMPTS[:2])) for d in distilled)
    assert torch.equal(a, b)


def test_latents_are_patchified_normalised_and_packed() -> None:
    backbone = _backbone()
    pipe, vae = backbone.pipe, backbone.pipe.vae
    assert float(vae.bn.running_mean.abs().max()) > 0.1 and float((vae.bn.running_var - 1).abs().max()) > 0.1
    maps = torch.randn(2, vae.config.latent_channels, 2 * backbone.side, 2 * backbone.side)
    patches = pipe._patchify_latents(maps)
    mean = vae.bn.running_mean.view(1, -1, 1, 1)
    std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps)
    tokens = pipe._pack_latents((patches - mean) / std)  # the pipeline's encoding of VAE latents
    assert tokens.shape == (2, *backbone.latent_shape)
    # the inverse, up to the float32 rounding of (z - m) / s * s + m on values of ~3
    torch.testing.assert_close(backbone.latents_from_tokens(tokens), maps, rtol=0, atol=1e-6)
    images = backbone.decode(tokens)
    assert images.shape == (2, 3, 32, 32) and float(images.min()) >= 0 and float(images.max()) <= 1


@pytest.mark.parametrize(("variant", "distilled", "scale", "rows"), [
    ("klein", False, 4.0, 2),  # klein-base with CFG: the negative row too
    ("klein", False, 1.0, 1),
    ("klein", True, 4.0, 1),  # distilled: one forward whatever the scale
    ("dev", False, 3.5, 1),  # embedded guidance: one forward
])
def test_nfe_counts_transformer_rows(variant: str, distilled: bool, scale: float, rows: int) -> None:
    backbone = _backbone(variant=variant, distilled=distilled, guidance_scale=scale, resolution=16)
    _ode(backbone, 3, backbone.noise(2, torch.Generator().manual_seed(0)), PROMPTS[:2])
    assert backbone.nfe == 2 * 3 * rows


def test_negative_branch_is_frozen() -> None:
    """With grad on, the negative forward has no gradient: d v / d theta = scale * d v_cond / d theta."""
    backbone = _backbone(resolution=16, guidance_scale=3.0)
    backbone.transformer.requires_grad_(True)
    x = backbone.noise(2, torch.Generator().manual_seed(0))
    s = torch.tensor([0.8, 0.4])
    cond = backbone.encode(["a cat", "a dog"])
    with torch.no_grad():
        batched = backbone.velocity(x, s, cond)  # rollout path: one [negative; cond] forward
    v = backbone.velocity(x, s, cond)  # training path: separate forwards
    torch.testing.assert_close(v, batched, rtol=0, atol=1e-5)  # batching moves it by ~1e-6 (values ~3)
    params = list(backbone.transformer.parameters())
    grads = torch.autograd.grad(v.square().sum(), params, allow_unused=True)
    weight = 2 * v.detach()
    v_cond = backbone._forward(x, backbone.timestep(s), cond.tensors["embeds"])
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
        calls.append(list(kwargs["prompt"]))  # type: ignore[call-overload]
        return original(*args, **kwargs)

    monkeypatch.setattr(backbone.pipe, "encode_prompt", counting)
    first = backbone.encode(["a cat", "a dog", "a cat"])
    second = backbone.encode(["a dog", "a cat"])
    assert calls == [["a cat", "a dog"]]
    assert torch.equal(first.tensors["embeds"][1], second.tensors["embeds"][0])
    # three stacked hidden-state layers: 3 x the text encoder's width, the transformer's joint_attention_dim
    assert first.tensors["embeds"].shape[-1] == backbone.pipe.transformer.config.joint_attention_dim == 3 * 16
    x = backbone.noise(2, torch.Generator().manual_seed(0))
    with torch.no_grad():
        for _ in range(3):
            backbone.velocity(x, torch.full((2,), 0.5), second)
    assert calls == [["a cat", "a dog"], [""]]  # the negative prompt, encoded once


@pytest.mark.parametrize("variant", ["klein", "dev"])
def test_flux2_loads_a_saved_folder_by_its_class(tmp_path: Path, variant: Literal["klein", "dev"]) -> None:
    save_tiny_flux2(TinyFlux2Spec(variant=variant, image_size=16), tmp_path / "model")
    settings = {"path": str(tmp_path / "model"), "resolution": 16, "max_sequence_length": 16, "dtype": "float32"}
    loaded = flowrl.build("backbone", {"type": "flux2", **settings})
    assert type(loaded.pipe).__name__ == ("Flux2KleinPipeline" if variant == "klein" else "Flux2Pipeline")
    built = _backbone(variant=variant, resolution=16)
    x1 = loaded.noise(3, torch.Generator().manual_seed(0))
    assert torch.equal(_ode(loaded, 2, x1), _ode(built, 2, x1))  # exact: the same weights and code, one process
    # what validate sees without building: a resolution the saved VAE refutes
    bad = {"name": "x", "backbone": {"type": "flux2", **settings, "resolution": 18}}
    with pytest.raises(RecipeError, match=r"backbone\.resolution.*multiple of 4"):
        recipe_from_dict({**tiny_recipe(), **bad})


def test_flux2_refuses_other_pipelines_and_fails_clearly_offline(tmp_path: Path) -> None:
    from flowrl.backbones.sd3.tiny import TinySD3Spec, save_tiny_sd3

    save_tiny_sd3(TinySD3Spec(image_size=16), tmp_path / "sd3")
    recipe = {**tiny_recipe(), "backbone": {"type": "flux2", "path": str(tmp_path / "sd3")}}
    with pytest.raises(RecipeError, match=r"backbone\.path.*StableDiffusion3Pipeline, not Flux2Pipeline"):
        recipe_from_dict(recipe)
    with pytest.raises(OSError, match="cannot load DiffusionPipeline from hub id .*HF_HUB_OFFLINE=1"):
        flowrl.build("backbone", {"type": "flux2", "path": "nobody/no-such-flux2-xyz"})
    with pytest.raises(RecipeError, match="resolution 18 must be a multiple of 4"):
        recipe_from_dict({**tiny_recipe(), "backbone": {"type": "tiny_flux2", "resolution": 18}})


def test_lora_targets_are_the_published_list_and_match_layers() -> None:
    from diffusers import Flux2Transformer2DModel

    from flowrl.backbones.flux2.adapter import Flux2FromPretrained

    # the flux2 list = diffusers' dreambooth FLUX.2-dev list; on a transformer with dev's 8 + 48 blocks (tiny
    # widths, no weights) every entry selects adaptable layers, and the single blocks' output is a plain Linear
    dev = on_meta(lambda: Flux2Transformer2DModel(
        in_channels=16, num_layers=8, num_single_layers=48, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=48, timestep_guidance_channels=32, axes_dims_rope=(4, 4, 4, 4),
    ))
    assert Flux2FromPretrained.lora_targets == BASE_TARGETS + single_block_outputs(48)
    for transformer, targets in ((dev, Flux2FromPretrained.lora_targets),
                                 (_backbone().transformer, TinyFlux2.lora_targets)):
        layers = [n for n, m in transformer.named_modules() if isinstance(m, ADAPTABLE)]
        for target in targets:
            assert any(matches(n, target) for n in layers), target
        assert isinstance(transformer.get_submodule("single_transformer_blocks.1.attn.to_out"), torch.nn.Linear)
    backbone = _backbone(resolution=16)
    add_lora(backbone.transformer, LoraConfig(rank=2), TinyFlux2.lora_targets)
    adapted = {n.rsplit(".lora_A", 1)[0] for n, _ in backbone.transformer.named_parameters() if ".lora_A" in n}
    assert "single_transformer_blocks.1.attn.to_out" in adapted and "transformer_blocks.0.attn.to_out.0" in adapted
    assert "single_transformer_blocks.0.attn.to_qkv_mlp_proj" in adapted
    assert not any("add_q_proj" in n or "ff." in n for n in adapted)  # not in the published list


def test_gradient_checkpointing_and_fsdp_units() -> None:
    backbone = _backbone(resolution=16)
    transformer: Any = backbone.transformer
    assert sharding_units(transformer) == [*transformer.transformer_blocks, *transformer.single_transformer_blocks]
    transformer.requires_grad_(True)
    x = backbone.noise(2, torch.Generator().manual_seed(0))
    cond, s = backbone.encode(["a cat", "a dog"]), torch.tensor([0.7, 0.2])
    grads = []
    for on in (False, True):
        if on:
            transformer.enable_gradient_checkpointing()
        transformer.zero_grad()
        backbone.velocity(x, s, cond).square().mean().backward()
        grads.append(torch.cat([p.grad.flatten() for p in transformer.parameters() if p.grad is not None]))
    assert transformer.is_gradient_checkpointing
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-7)  # recomputation, same float32 ops


@pytest.mark.parametrize(("variant", "scale"), [("klein", 4.0), ("dev", 3.5)])
def test_attention_probe_keeps_the_velocity(variant: str, scale: float) -> None:
    from flowrl.backbones.common.probe_options import AttentionEntropyOptions

    backbone = _backbone(variant=variant, guidance_scale=scale, resolution=16)
    x = backbone.noise(3, torch.Generator().manual_seed(0))
    s, cond = torch.tensor([0.9, 0.5, 0.1]), backbone.encode(PROMPTS)
    with torch.no_grad():
        v = backbone.velocity(x, s, cond)
    nfe = backbone.nfe
    probed, entropy = backbone.velocity_and_entropy(x, s, cond, None)
    assert backbone.nfe - nfe == nfe - 0 and entropy.shape == (3,)  # one forward of the same rows
    torch.testing.assert_close(probed, v, rtol=0, atol=1e-6)  # the same kernels; the cat of q/k moves ~1e-7
    keys = backbone.config.max_sequence_length + backbone.side**2
    assert bool(((entropy > 0) & (entropy <= np.log(keys) + 1e-5)).all())
    text = AttentionEntropyOptions(keys="text", normalise=True, layers=(0, 2))
    _, normalised = backbone.velocity_and_entropy(x, s, cond, text)
    assert bool(((normalised > 0) & (normalised <= 1)).all()) and not torch.allclose(normalised, entropy)


def test_trainer_runs_egrpo_anchor_branch_with_lora_and_checkpointing() -> None:
    """E-GRPO's paper form (merged units from a shared ODE anchor) on klein-base with CFG."""
    data = tiny_recipe(gradient_checkpointing=True)
    data["backbone"] = {"type": "tiny_flux2", "resolution": 16, "num_single_layers": 2}
    data["selector"] = {"type": "egrpo_entropy", "units": [[0, 1], [1, 2]]}
    data["schedule"] = {"num_steps": 6, "shift": 3.0}
    data["sampler"] = {"type": "anchor_branch", "group_size": 3}
    data["lora"] = {"rank": 4}
    data["trainer"]["max_steps"] = 1
    recipe = recipe_from_dict(data)
    assert recipe.lora is not None and recipe.lora.target_modules == TinyFlux2.lora_targets
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(recipe, Path(tmp), quiet=True)
        assert trainer.backbone.transformer.is_gradient_checkpointing
        metrics = [trainer.iteration() for _ in range(2)]
        trainer.logger.close()
        trainer.release()
    assert all(np.isfinite(m["loss"]) and m["grad_norm"] > 0 for m in metrics)
    n, g, p = 6, 3, 2
    per_prompt = (1 + 1) + g * ((n - 0 - 1) + (n - 1 - 2))  # anchor to the last start, then each unit's tail
    assert metrics[0]["nfe"] == 2 * p * per_prompt  # x 2 rows: CFG


def test_smoke_and_shipped_recipes_validate() -> None:
    for path in [ROOT / "recipes" / "smoke" / "flux2.toml", *sorted((ROOT / "recipes" / "flux2").glob("*.toml"))]:
        recipe = load_recipe(path)
        assert recipe.parts["backbone"].type in ("flux2", "tiny_flux2"), path
        assert tomllib.loads(path.read_text())["name"], path


@pytest.mark.slow
def test_smoke_recipe_trains(tmp_path: Path) -> None:
    from flowrl.cli.main import main as flowrl_main

    recipe = str(ROOT / "recipes" / "smoke" / "flux2.toml")
    assert flowrl_main(["train", recipe, "--output-dir", str(tmp_path / "run"), "--quiet"]) == 0
    rows = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert sum(1 for row in rows if '"grad_norm"' in row) == 20  # every iteration of the recipe


@pytest.mark.parametrize("variant", ["klein", "dev"])
def test_exported_lora_loads_into_the_flux2_pipeline(tmp_path: Path, variant: Literal["klein", "dev"]) -> None:
    """The checkpoint's LoRA export (diffusers format) in a fresh pipeline samples what flowrl samples."""
    from diffusers import Flux2KleinPipeline, Flux2Pipeline

    save_tiny_flux2(TinyFlux2Spec(variant=variant, image_size=16), tmp_path / "base")
    data = tiny_recipe()
    data["backbone"] = {"type": "flux2", "path": str(tmp_path / "base"), "resolution": 16,
                        "max_sequence_length": 16, "dtype": "float32"}
    data["lora"] = {"rank": 4, "alpha": 8.0, "target_modules": list(TinyFlux2.lora_targets)}
    data["optim"] = {"lr": 1e-2}
    trainer = Trainer(recipe_from_dict(data), tmp_path / "run", quiet=True)
    trainer.run()
    trainer.release()
    lora = tmp_path / "run" / "checkpoints" / "step_000002" / "lora"
    backbone: Any = trainer.backbone
    backbone.module.eval()
    x1 = backbone.noise(len(PROMPTS), torch.Generator().manual_seed(3))
    ours = _ode(backbone, 3, x1)
    fresh = (Flux2KleinPipeline if variant == "klein" else Flux2Pipeline).from_pretrained(
        tmp_path / "base", local_files_only=True)
    fresh.set_progress_bar_config(disable=True)
    fresh.load_lora_weights(lora)

    def sample() -> torch.Tensor:
        with torch.no_grad():
            out = fresh(prompt=PROMPTS, latents=_maps(backbone, x1), num_inference_steps=3, height=16, width=16,
                        max_sequence_length=16, output_type="latent").images
        return out if variant == "dev" else fresh._pack_latents(  # back to tokens, as flowrl's
            (fresh._patchify_latents(out) - fresh.vae.bn.running_mean.view(1, -1, 1, 1))
            / torch.sqrt(fresh.vae.bn.running_var.view(1, -1, 1, 1) + fresh.vae.config.batch_norm_eps))

    theirs = sample()
    diff = float((ours - theirs).abs().max())
    print(f"flux2 {variant}: max |flowrl - diffusers with exported LoRA| = {diff:.3g}")
    # measured: 0 for dev, 1.2e-6 for klein-base (CFG batched in flowrl, two forwards in the pipeline) on latents
    # of ~4; 1e-4 leaves room for the LoRA layers' other summation order on other machines
    assert diff <= 1e-4
    fresh.unload_lora_weights()
    assert float((ours - sample()).abs().max()) > 100 * max(diff, 1e-6)  # the trained LoRA matters


@pytest.mark.parametrize("lora", [True, False])
def test_bfloat16_trains_with_fp32_velocities(lora: bool) -> None:
    """bf16 transformer weights + fp32 trainable weights (LoRA, or a full fine-tune's master weights) under autocast."""
    backbone = _backbone(resolution=16, dtype="bfloat16")
    transformer = backbone.transformer
    if lora:
        add_lora(transformer, LoraConfig(rank=4), TinyFlux2.lora_targets)
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


def test_aegpo_recipe_runs_on_the_tiny_twin(tmp_path: Path) -> None:
    """recipes/flux2/aegpo_dance_hps.toml's parts (the probe picks the steps and splits the budget) on tiny_flux2."""
    from conftest import TINY_TRAINER

    data = tomllib.loads((ROOT / "recipes" / "flux2" / "aegpo_dance_hps.toml").read_text())
    data["backbone"] = {"type": "tiny_flux2", "resolution": 16}
    data["prompts"] = {"type": "list", "prompts": PROMPTS, "heldout": ["a dog"]}
    data["reward"] = [{"type": "jpeg_compressibility", "scale_kb": 1.0}]
    data["schedule"] = {"num_steps": 6, "shift": 3.0}
    data["selector"]["k"] = 2
    data["sampler"].update(min_group=2, max_group=6)
    data["sampler"]["host"]["group_size"] = 3
    data["trainer"] = {**TINY_TRAINER, "max_steps": 2}
    trainer = Trainer(recipe_from_dict(data), tmp_path / "run", quiet=True)
    metrics = [trainer.iteration() for _ in range(2)]
    trainer.logger.close()
    trainer.release()
    assert all(np.isfinite(m["loss"]) and m["grad_norm"] > 0 and m["nfe"] > 0 for m in metrics)


def test_default_lora_targets_follow_the_saved_models_single_blocks(tmp_path: Path) -> None:
    """A [lora] without target_modules gets one single-block output per block of the model in the folder (klein
    has fewer than dev's 48), so validate finds every default entry in the model's layers."""
    from flowrl.backbones.flux2.adapter import Flux2FromPretrained

    save_tiny_flux2(TinyFlux2Spec(image_size=16, num_single_layers=3), tmp_path / "klein")
    table = {"type": "flux2", "path": str(tmp_path / "klein"), "resolution": 16, "max_sequence_length": 16}
    recipe = recipe_from_dict({**tiny_recipe(), "backbone": table, "lora": {"rank": 2}})  # validate's checks pass
    assert recipe.lora is not None and recipe.lora.target_modules == BASE_TARGETS + single_block_outputs(3)
    assert Flux2FromPretrained.default_lora_targets(Flux2FromPretrained.Config(path="nobody/not-here")) == (
        Flux2FromPretrained.lora_targets  # the model's config is not on this machine: dev's list
    )
    four = recipe_from_dict({**tiny_recipe(), "backbone": {"type": "tiny_flux2", "num_single_layers": 4},
                             "lora": {"rank": 2}})
    assert four.lora is not None and four.lora.target_modules[-1] == "single_transformer_blocks.3.attn.to_out"
