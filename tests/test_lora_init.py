"""Training starts from an existing LoRA (``[lora] init``): a diffusers folder or file, a peft folder, or one file
in the kohya key naming that the export writes beside the diffusers folder. Each is read back to the same
tensors, rank and alpha; the kohya file samples in diffusers what flowrl samples; a file that does not fit the
base is refused at validate, naming the file and the key."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import tiny_recipe
from safetensors.torch import load_file, save_file

from flowrl.backbones.lora.export import KOHYA_SUFFIX, LORA_FOLDER, export_lora, lora_state_dict
from flowrl.backbones.lora.load import LoraInitError, read_lora
from flowrl.cli.main import main
from flowrl.config.recipe import RecipeError, recipe_from_dict
from flowrl.config.settings import LoraConfig
from flowrl.config.tomlwrite import dumps
from flowrl.core.types import Plan, Schedule
from flowrl.parts.samplers.walk import walk
from flowrl.trainer.loop import Trainer
from flowrl.trainer.lora import add_lora

RANK, ALPHA = 4, 8.0  # scale alpha / rank = 2: a reader that drops alpha gives other samples
PROMPTS = ["a red circle", "two blue squares"]
STEPS = 4


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A tiny saved FLUX base, and a LoRA on it with non-zero B (what training makes) exported three ways."""
    import flowrl
    from flowrl.backbones.flux.tiny import TinyFluxSpec, save_tiny_flux

    root = tmp_path_factory.mktemp("lora_init")
    save_tiny_flux(TinyFluxSpec(image_size=16, pixel_space=False, num_layers=1, num_single_layers=1), root / "base")
    table = {"type": "flux", "path": str(root / "base"), "resolution": 16, "max_sequence_length": 16,
             "dtype": "float32"}
    backbone = flowrl.build("backbone", table)
    add_lora(backbone.transformer, LoraConfig(rank=RANK, alpha=ALPHA), type(backbone).lora_targets)
    generator = torch.Generator().manual_seed(0)
    for name, param in backbone.transformer.named_parameters():
        if "lora_B" in name:
            param.data = 0.3 * torch.randn(param.shape, generator=generator)
    assert export_lora(backbone, root / LORA_FOLDER) == root / LORA_FOLDER
    layers = lora_state_dict(backbone.transformer)
    peft = root / "peft"  # peft's own layout: save_pretrained's config and base_model.model.-prefixed tensors
    backbone.transformer.peft_config["default"].save_pretrained(str(peft))
    save_file({f"base_model.model.{k}": v for k, v in layers.items()}, str(peft / "adapter_model.safetensors"))
    return {"root": root, "table": table, "backbone": backbone, "layers": layers}


def _recipe(exported: dict[str, Any], init: str, tmp_path: Path) -> Path:
    data = tiny_recipe()
    data["backbone"] = exported["table"]
    data["lora"] = {"init": init}
    path = tmp_path / "recipe.toml"
    path.write_text(dumps(data))
    return path


SOURCES = {
    "diffusers folder": LORA_FOLDER,
    "diffusers file": f"{LORA_FOLDER}/pytorch_lora_weights.safetensors",
    "kohya file": f"{LORA_FOLDER}{KOHYA_SUFFIX}",
    "peft folder": "peft",
}


@pytest.mark.parametrize("source", SOURCES)
def test_training_starts_from_the_exported_lora(source: str, exported: dict[str, Any], tmp_path: Path) -> None:
    init = str(exported["root"] / SOURCES[source])
    recipe = recipe_from_dict(tomllib.loads(_recipe(exported, init, tmp_path).read_text()))
    assert main(["validate", str(tmp_path / "recipe.toml")]) == 0
    trainer = Trainer(recipe, tmp_path / "run", quiet=True)
    try:
        config = trainer.backbone.transformer.peft_config["default"]
        assert (config.r, config.lora_alpha) == (RANK, ALPHA)  # read from the file, not the table's defaults
        loaded = lora_state_dict(trainer.backbone.transformer)
        assert loaded.keys() == exported["layers"].keys()
        # exact: the same float32 tensors copied into the adapters
        assert all(torch.equal(loaded[k], exported["layers"][k]) for k in loaded)
        assert all(p.requires_grad for n, p in trainer.backbone.transformer.named_parameters() if "lora_" in n)
    finally:
        trainer.release()


def test_the_kohya_file_samples_in_diffusers_what_flowrl_samples(exported: dict[str, Any]) -> None:
    from diffusers import FluxPipeline

    backbone = exported["backbone"]
    schedule = Schedule(backbone.schedule_sigmas(STEPS, 3.0), None)  # type: ignore[arg-type]
    x1 = backbone.noise(len(PROMPTS), torch.Generator().manual_seed(3))
    backbone.module.eval()
    with torch.no_grad():
        ours = walk(backbone, x1, backbone.encode(PROMPTS), torch.arange(2), 0, Plan((), ()), schedule, None)
    fresh = FluxPipeline.from_pretrained(exported["root"] / "base", local_files_only=True)
    fresh.set_progress_bar_config(disable=True)

    def sample() -> torch.Tensor:
        out = fresh(prompt=PROMPTS, latents=x1.clone(), num_inference_steps=STEPS, height=16, width=16,
                    max_sequence_length=16, output_type="latent")
        return out.images  # type: ignore[no-any-return]

    base = sample()
    fresh.load_lora_weights(str(exported["root"] / f"{LORA_FOLDER}{KOHYA_SUFFIX}"))
    theirs = sample()
    diff = float((ours - theirs).abs().max())
    print(f"max |flowrl - diffusers with the kohya file| = {diff:.3g}")
    # the same bound as the diffusers-folder test (test_lora_export): float32 sums in another order
    assert diff <= 1e-4
    assert float((ours - base).abs().max()) > 100 * max(diff, 1e-6)  # the LoRA changes the samples


def test_kohya_naming_round_trips_exactly(exported: dict[str, Any]) -> None:
    kohya = load_file(str(exported["root"] / f"{LORA_FOLDER}{KOHYA_SUFFIX}"))
    layers = exported["layers"]
    assert len(kohya) == len(layers) // 2 * 3  # down, up and alpha per layer
    assert all(float(v) == ALPHA for k, v in kohya.items() if k.endswith(".alpha"))
    lora = read_lora(exported["root"] / f"{LORA_FOLDER}{KOHYA_SUFFIX}")
    modules = lora.modules(n for n, _ in exported["backbone"].transformer.named_modules())
    for layer in lora.layers:
        assert torch.equal(kohya[layer.a_key], layers[f"{modules[layer.name]}.lora_A.weight"])
        assert torch.equal(kohya[layer.b_key], layers[f"{modules[layer.name]}.lora_B.weight"])


def test_a_key_the_base_lacks_is_refused_at_validate_and_at_training(
    exported: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tensors = load_file(str(exported["root"] / f"{LORA_FOLDER}{KOHYA_SUFFIX}"))
    bad_key = next(k for k in sorted(tensors) if k.endswith("to_q.lora_down.weight"))
    stem = bad_key.removesuffix(".lora_down.weight")
    renamed = {k.replace(stem, stem + "x") if k.startswith(stem + ".") else k: v for k, v in tensors.items()}
    file = tmp_path / "other_model.safetensors"
    save_file(renamed, str(file))
    recipe_file = _recipe(exported, str(file), tmp_path)
    assert main(["validate", str(recipe_file)]) == 2
    out = capsys.readouterr().out
    assert "lora.init" in out and str(file) in out and f"{stem}x.lora_down.weight" in out, out
    with pytest.raises(RecipeError, match="names no layer"):
        Trainer(recipe_from_dict(tomllib.loads(recipe_file.read_text())), tmp_path / "run", quiet=True)


def _pair(rank: int, width: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros(rank, width), torch.zeros(width, rank)


@pytest.mark.parametrize(
    ("tensors", "why"),
    [
        ({"lora_transformer_a.lora_down.weight": _pair(2)[0]}, "no up / B matrix"),
        ({"lora_transformer_a.lora_down.weight": _pair(2)[0], "lora_transformer_a.lora_up.weight": _pair(2)[1],
          "lora_transformer_b.lora_down.weight": _pair(3)[0], "lora_transformer_b.lora_up.weight": _pair(3)[1]},
         "has rank 3, others 2"),
        ({"lora_transformer_a.lora_down.weight": _pair(2)[0], "lora_transformer_a.lora_up.weight": _pair(2)[1],
          "lora_transformer_a.hada_w1_a": _pair(2)[0]}, "not a LoRA matrix"),
        ({"lora_transformer_a.lora_down.weight": _pair(2)[0], "lora_transformer_a.lora_up.weight": _pair(3)[1]},
         "not a linear layer's LoRA pair"),
    ],
    ids=["no up", "two ranks", "LoHa key", "mismatched pair"],
)
def test_files_that_cannot_start_training_name_the_file_and_the_key(
    tensors: dict[str, torch.Tensor], why: str, tmp_path: Path
) -> None:
    file = tmp_path / "lora.safetensors"
    save_file(tensors, str(file))
    with pytest.raises(LoraInitError, match=why) as error:
        read_lora(file)
    assert str(error.value).startswith(f"lora.init {file}: ")


def test_missing_paths_and_other_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(LoraInitError, match="no such file or folder"):
        read_lora(tmp_path / "missing.safetensors")
    (tmp_path / "lora.bin").write_bytes(b"x")
    with pytest.raises(LoraInitError, match="expected a .safetensors file"):
        read_lora(tmp_path / "lora.bin")
    (tmp_path / "broken.safetensors").write_bytes(b"\x01")
    with pytest.raises(LoraInitError, match="not a readable .safetensors file"):
        read_lora(tmp_path / "broken.safetensors")
    with pytest.raises(LoraInitError, match="holds neither"):
        read_lora(tmp_path)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_alpha_is_read_from_the_alpha_tensors_and_is_the_rank_without_them(dtype: torch.dtype, tmp_path: Path) -> None:
    down, up = _pair(4)
    file = tmp_path / "lora.safetensors"
    save_file({"lora_unet_a.lora_down.weight": down, "lora_unet_a.lora_up.weight": up,
               "lora_unet_a.alpha": torch.tensor(12.5, dtype=dtype)}, str(file))
    lora = read_lora(file)
    assert (lora.rank, lora.alpha) == (4, 12.5)  # 12.5 is exact in all three dtypes
    save_file({"lora_unet_a.lora_down.weight": down, "lora_unet_a.lora_up.weight": up}, str(file))
    assert read_lora(file).alpha == 4.0


def test_a_run_from_an_existing_lora_opens_without_that_file(exported: dict[str, Any], tmp_path: Path) -> None:
    """Its checkpoints hold every trained LoRA tensor and their own export: with the init file gone, eval,
    sample and --resume still open the run; checkpoints/best has the diffusers folder and the kohya file too."""
    import shutil

    from flowrl.export.loading import load_policy

    source = tmp_path / "init"
    shutil.copytree(exported["root"] / LORA_FOLDER, source)
    recipe = _recipe(exported, str(source), tmp_path)
    assert main(["train", str(recipe), "--output-dir", str(tmp_path / "run"), "--quiet",
                 "--set", "trainer.eval_every=1", "--set", "trainer.checkpoint_every=1"]) == 0
    best = tmp_path / "run" / "checkpoints" / "best"
    assert (best / LORA_FOLDER / "pytorch_lora_weights.safetensors").is_file()
    assert (best.parent / f"best{KOHYA_SUFFIX}").is_file() or (best / f"{LORA_FOLDER}{KOHYA_SUFFIX}").is_file()
    shutil.rmtree(source)
    policy = load_policy(tmp_path / "run")
    trained = load_file(str(tmp_path / "run" / "checkpoints" / "step_000002" / "weights.safetensors"))
    loaded = dict(policy.backbone.transformer.named_parameters())
    assert all(torch.equal(loaded[k], v) for k, v in trained.items())
    assert main(["eval", str(tmp_path / "run"), "--checkpoint", "best", "--json"]) == 0
    assert main(["train", str(recipe), "--resume", str(tmp_path / "run"), "--quiet",
                 "--set", "trainer.max_steps=3"]) == 0
