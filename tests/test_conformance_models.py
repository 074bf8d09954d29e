"""Every registered reward and backbone keeps its interface's rules (flowrl.conformance), on local weights: the
tiny reward weights of tests/data/rewards (as tests/test_rewards.py and tests/test_imagereward.py use them),
the tiny FLUX and SD3 models (saved to a folder for the ``flux`` and ``sd3`` loaders) and the embedded world's
model; with every shipped recipe's reward and backbone settings (weights swapped for the local ones); and
each check catches a deliberately broken part. HPSv2 and OCR need their extras (``nox -s extras``)."""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
from conftest import ROOT
from test_conformance import PROMPTS, RECIPES, loaded

import flowrl
from flowrl.config.recipe import load_recipe
from flowrl.conformance import ConformanceError, check_backbone, check_reward, check_sampler
from flowrl.core.registry import registry
from flowrl.core.types import Plan, Schedule, Unit
from flowrl.rewards.base import has_module
from flowrl.world.components import BASE_MODEL
from flowrl.world.grammar import enumerate_scenes
from flowrl.world.render import render_batch

DATA = ROOT / "tests" / "data" / "rewards"
CLIP, IR = str(DATA / "clip"), DATA / "imagereward"
INF = math.inf
# name -> (local settings, documented bounds of the raw score (docs/rewards.md) or None where only typical
# values are documented, modules it needs)
REWARDS: dict[str, tuple[dict[str, Any], tuple[float, float] | None, tuple[str, ...]]] = {
    "aesthetic": ({"model": CLIP, "head": str(DATA / "aesthetic_head.pth"), "device": "cpu"}, None, ()),
    "clipscore": ({"model": CLIP, "device": "cpu"}, (-1.0, 1.0), ()),  # a cosine
    "hpsv2": (
        {"checkpoint": str(DATA / "hps" / "tiny_hps.pt"), "model": "tiny-hps",
         "model_config": str(DATA / "hps" / "tiny-hps.json"), "device": "cpu"},
        (-1.0, 1.0),  # a dot product of unit vectors
        ("hpsv2", "open_clip"),
    ),
    "imagereward": (
        {"checkpoint": str(IR / "ImageReward.pt"), "med_config": str(IR / "med_config.json"),
         "tokenizer": str(IR / "tokenizer"), "vision_heads": 2, "device": "cpu"},
        None,
        (),
    ),
    "jpeg_compressibility": ({}, (-INF, 0.0), ()),  # minus a file size
    "ocr": ({}, (0.0, 1.0), ("rapidocr_onnxruntime",)),
    "pickscore": ({"model": CLIP, "processor": CLIP, "device": "cpu"}, None, ()),
    "world_verifier": ({}, (0.0, 1.0), ()),
    "world_edit_verifier": ({}, (0.0, 1.0), ()),  # edits of the rendered scenes, each scene its source
    "remote": ({}, (0.0, 1.0), ()),  # the world verifier, served on 127.0.0.1 in a thread (served_verifier)
    "edit_judge": ({}, (0.0, 1.0), ()),  # a stand-in OpenAI-style judge on 127.0.0.1 (stand_in_judge)
    "edit_preservation": ({}, (-1.0, 1.0), ()),  # SSIM
    "edit_feature_similarity": ({"device": "cpu"}, (-1.0, 1.0), ()),  # a cosine; a tiny DINOv2 (tiny_features)
}
# scored against an edit of each scene, the scene its source
EDIT_REWARDS = ("world_edit_verifier", "edit_judge", "edit_preservation", "edit_feature_similarity")
FLOAT32_TOL, REDUCED_TOL = 1e-4, 3e-2  # see flowrl.conformance.backbones.TOLERANCE
SCENES = enumerate_scenes("train")[:200:50]  # a single object and relations, all in the tiny models' words
WORLD_PROMPTS = [s.text for s in SCENES]


def images() -> torch.Tensor:
    """Rendered world scenes (the verifier finds what their prompts ask) and one image of noise."""
    out = torch.from_numpy(render_batch(SCENES, 0)).permute(0, 3, 1, 2).float() / 255
    out[-1] = torch.rand(out.shape[1:], generator=torch.Generator().manual_seed(0))
    return out


@functools.cache
def served_verifier() -> str:
    """The address of a `flowrl serve world_verifier` application in a daemon thread (lives as long as the tests)."""
    from served import reward_in_thread

    from flowrl.world.components import WorldVerifier

    context = reward_in_thread(WorldVerifier(WorldVerifier.Config()), "world_verifier", max_body_bytes=1 << 26)
    _SERVERS.append(context)  # held: a collected context manager would stop its server
    return context.__enter__().url


_SERVERS: list[Any] = []


@functools.cache
def tiny_features() -> str:
    """A tiny random DINOv2 saved to a folder (tests/test_edit_feature_similarity.py builds it)."""
    import tempfile

    from test_edit_feature_similarity import tiny_dinov2

    return tiny_dinov2(Path(tempfile.mkdtemp(prefix="conformance-dinov2-")) / "model")


@functools.cache
def stand_in_judge() -> str:
    """The address of a stand-in VLM judge (tests/served.py's edit_judge_app) in a daemon thread, answering with
    log-probabilities (lives as long as the tests)."""
    from served import edit_judge_app, in_thread, judge_answer

    app = edit_judge_app(lambda body: judge_answer('{"score": [8, 6]}', alternatives={0: {"8": 0.6, "7": 0.4}}),
                         lambda body: judge_answer('{"score": [9, 7]}', digits_apart=True))
    context = in_thread(app)
    _SERVERS.append(context)
    return context.__enter__().url


def reward_prompts(name: str) -> list[str]:
    if name in EDIT_REWARDS:  # an edit of each scene, the scene's rendering its source image
        from flowrl.core.conditions import Condition, Prompt
        from flowrl.world.edit import _edits_of

        sources = render_batch(SCENES, 0)
        return [Prompt(_edits_of(s)[0].text, [Condition(img)]) for s, img in zip(SCENES, sources, strict=True)]
    return ['a sign that says "OPEN"'] * len(SCENES) if name == "ocr" else list(WORLD_PROMPTS)


def local_reward(name: str, settings: dict[str, Any]) -> tuple[Any, tuple[float, float] | None]:
    """The reward with ``settings`` and the local weights, and its documented bounds after rescaling."""
    local, bounds, modules = REWARDS[name]
    if name == "remote":
        local = {**local, "url": served_verifier(), "retries": 0}
    if name == "edit_judge":
        local = {**local, "url": stand_in_judge(), "retries": 0}
    if name == "edit_feature_similarity":
        local = {**local, "model": tiny_features()}
    for module in modules:
        if not has_module(module):
            pytest.skip(f"reward '{name}' needs {module} (its extra; nox -s extras)")
    reward = flowrl.build("reward", {**settings, **local, "type": name})
    offset, scale = getattr(reward.config, "offset", 0.0), getattr(reward.config, "scale", 1.0)
    if bounds is not None:
        ends = sorted(((bounds[0] - offset) * scale, (bounds[1] - offset) * scale))
        bounds = (ends[0], ends[1])
    return reward, bounds


@pytest.mark.parametrize("name", sorted(REWARDS))
def test_every_reward_conforms(name: str) -> None:
    reward, bounds = local_reward(name, {})
    check_reward(reward, images(), reward_prompts(name), bounds=bounds)


def recipe_tables(kind: str) -> list[Any]:
    """The distinct (type, settings) of ``kind`` across the shipped recipes, as pytest parameters."""
    seen: dict[str, tuple[str, dict[str, Any]]] = {}
    for path in RECIPES:
        recipe = load_recipe(path)
        parts = recipe.rewards if kind == "reward" else (recipe.parts[kind],)
        for part in parts:
            settings = attrs.asdict(part.config)
            seen.setdefault(f"{part.type}{sorted(settings.items())}", (part.type, settings))
    return [pytest.param(*table, id=f"{table[0]}-{i}") for i, table in enumerate(seen.values())]


@pytest.mark.parametrize(("name", "settings"), recipe_tables("reward"))
def test_recipe_rewards_conform(name: str, settings: dict[str, Any]) -> None:
    reward, bounds = local_reward(name, settings)
    check_reward(reward, images(), reward_prompts(name), bounds=bounds)


# -- backbones ------------------------------------------------------------------------------------
@functools.cache
def saved(kind: str) -> str:
    """A tiny latent-space FLUX or SD3 pipeline saved as a folder (what the ``flux`` / ``sd3`` loaders read)."""
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix=f"conformance-{kind}-")) / "model"
    if kind == "flux":
        from flowrl.backbones.flux.tiny import TinyFluxSpec, save_tiny_flux

        save_tiny_flux(TinyFluxSpec(image_size=16, pixel_space=False, num_layers=1, num_single_layers=1), folder)
    elif kind == "flux_kontext":  # FLUX.1-Kontext-dev's class: FluxKontextPipeline, embedded guidance
        from flowrl.backbones.common.tiny import save_pipeline
        from flowrl.backbones.flux.tiny import TinyFluxSpec, tiny_flux_kontext_pipeline

        spec = TinyFluxSpec(image_size=16, pixel_space=False, num_layers=1, num_single_layers=1, guidance_embeds=True)
        save_pipeline(tiny_flux_kontext_pipeline(spec), folder)
    elif kind == "flux2":  # the recipes' FLUX.2-dev class (Flux2Pipeline, embedded guidance)
        from flowrl.backbones.flux2.tiny import TinyFlux2Spec, save_tiny_flux2

        save_tiny_flux2(TinyFlux2Spec(variant="dev", image_size=16), folder)
    elif kind == "qwen_image":
        from flowrl.backbones.qwen_image.tiny import TinyQwenImageSpec, save_tiny_qwen_image

        save_tiny_qwen_image(TinyQwenImageSpec(image_size=16), folder)
    elif kind == "qwen_image_edit":  # Qwen-Image-Edit's class: QwenImageEditPipeline (one source image)
        from flowrl.backbones.qwen_image.tiny import TinyQwenImageEditSpec, save_tiny_qwen_image_edit

        save_tiny_qwen_image_edit(TinyQwenImageEditSpec(image_size=16), folder)
    elif kind == "wan":
        from flowrl.backbones.wan.tiny import TinyWanSpec, save_tiny_wan

        save_tiny_wan(TinyWanSpec(), folder)
    else:
        from flowrl.backbones.sd3.tiny import TinySD3Spec, save_tiny_sd3

        save_tiny_sd3(TinySD3Spec(image_size=16), folder)
    return str(folder)


SMALL = {"resolution": 16, "max_sequence_length": 16}
BACKBONES: dict[str, Any] = {
    "flux": lambda: {"path": saved("flux"), **SMALL, "dtype": "float32"},
    "sd3": lambda: {"path": saved("sd3"), **SMALL, "dtype": "float32"},
    "tiny_flux": lambda: {"resolution": 16, "num_layers": 1, "num_single_layers": 1},
    # text prompts: FLUX.1's forward (tests/test_flux_kontext.py checks the rules with source images)
    "flux_kontext": lambda: {"path": saved("flux_kontext"), **SMALL, "dtype": "float32"},
    "tiny_flux_kontext": lambda: {"resolution": 16, "num_layers": 1, "num_single_layers": 1},
    "tiny_sd3": lambda: {"resolution": 16},
    "world_tiny": lambda: {},
    "world_edit_tiny": lambda: {"path": str(BASE_MODEL)},  # text-to-image weights: text prompts, the world's forward
    # the recipes' frame sizes replaced by SMALL's side; their num_frames, CFG and grid kept
    "wan": lambda: {"path": saved("wan"), **SMALL, "height": 0, "width": 0, "dtype": "float32"},
    "tiny_wan": lambda: {"resolution": 16, "num_frames": 5},
    "flux2": lambda: {"path": saved("flux2"), **SMALL, "dtype": "float32"},
    "tiny_flux2": lambda: {"resolution": 16},  # klein-base: CFG with the frozen negative branch
    "qwen_image": lambda: {"path": saved("qwen_image"), **SMALL, "dtype": "float32"},
    "tiny_qwen_image": lambda: {"resolution": 16},  # true CFG with the norm rescale, the pipeline's grid
    # edit bases that need a source: the world's edit prompts (tests/test_qwen_image_edit.py checks the rest)
    "qwen_image_edit": lambda: {"path": saved("qwen_image_edit"), **SMALL, "dtype": "float32"},
    "tiny_qwen_image_edit": lambda: {"resolution": 16},
}


def run_backbone_check(name: str, settings: dict[str, Any]) -> None:
    if name in ("flux", "flux_kontext", "sd3", "wan", "flux2", "qwen_image", "qwen_image_edit"):
        settings = {**settings, **BACKBONES[name]()} | {"dtype": settings.get("dtype", "float32")}
        if name == "qwen_image_edit":  # the recipes' Edit-Plus and vision side on the saved Edit twin
            settings |= {"pipeline": "edit", "images": 1, "vision_resolution": 0}
    tolerance = FLOAT32_TOL if settings.get("dtype", "float32") == "float32" else REDUCED_TOL
    cls = registry("backbone").get(name)
    needed = cls.accepts(cls.Config(**settings)).count[0]
    prompts = reward_prompts("world_edit_verifier")[:3] if needed else WORLD_PROMPTS[:3]  # one source each
    check_backbone(lambda: flowrl.build("backbone", {**settings, "type": name}), prompts, tolerance=tolerance)


@pytest.mark.parametrize("name", sorted(BACKBONES))
def test_every_backbone_conforms(name: str) -> None:
    run_backbone_check(name, BACKBONES[name]())


@pytest.mark.parametrize(("name", "settings"), recipe_tables("backbone"))
def test_recipe_backbones_conform(name: str, settings: dict[str, Any]) -> None:
    run_backbone_check(name, settings)  # flux / sd3: the recipe's settings on the tiny saved model, 16 px


def test_guided_sd3_sampling_counts_two_rows_per_step() -> None:
    """check_sampler counts the transformer's rows: a guided SD3 step costs 2 (flowrl.backbones.sd3.adapter)."""
    backbone = flowrl.build("backbone", {"type": "tiny_sd3", "resolution": 16, "guidance_scale": 4.5})
    recipe, schedule = loaded(ROOT / "recipes" / "flow_grpo.toml")
    schedule = Schedule(backbone.schedule_sigmas(4, 3.0), schedule.kernel)
    plan = Plan(units=(Unit(0),), trained=(0,))
    rollout = check_sampler(lambda: recipe.build("sampler"), backbone, schedule, plan, PROMPTS)
    assert rollout.nfe == 2 * 4 * rollout.num_rollouts


# -- the checks can fail ------------------------------------------------------------------------
JPEG = registry("reward").get("jpeg_compressibility")
TINY_FLUX = registry("backbone").get("tiny_flux")


class BatchCentredJpeg(JPEG):  # type: ignore[misc, valid-type]
    """Centres the scores over the batch: an image's score depends on its neighbours."""

    def score(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        raw = super().score(images, prompts)
        return raw - raw.mean() - 1.0


class NoisyJpeg(JPEG):  # type: ignore[misc, valid-type]
    def score(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        return super().score(images, prompts) - 1e-3 * torch.rand(images.shape[0])


class PositiveJpeg(JPEG):  # type: ignore[misc, valid-type]
    def score(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        return -super().score(images, prompts)


@pytest.mark.parametrize(
    ("reward", "rule"),
    [(BatchCentredJpeg, "one by one"), (NoisyJpeg, "not deterministic"), (PositiveJpeg, "documented range")],
)
def test_broken_rewards_are_caught(reward: type, rule: str) -> None:
    with pytest.raises(ConformanceError, match=rule):
        check_reward(reward(reward.Config()), images(), WORLD_PROMPTS, bounds=(-INF, 0.0))


class UncountedFlux(TINY_FLUX):  # type: ignore[misc, valid-type]
    """Forgets to count the rows of its velocity calls."""

    def velocity(self, x: torch.Tensor, s: torch.Tensor, cond: Any) -> torch.Tensor:
        v = super().velocity(x, s, cond)
        self.nfe -= int(x.shape[0])
        return v


class BatchMixingFlux(TINY_FLUX):  # type: ignore[misc, valid-type]
    """Adds the batch's mean: a row's velocity depends on the others."""

    def velocity(self, x: torch.Tensor, s: torch.Tensor, cond: Any) -> torch.Tensor:
        v = super().velocity(x, s, cond)
        return v + v.mean(0, keepdim=True)


class RisingScheduleFlux(TINY_FLUX):  # type: ignore[misc, valid-type]
    def schedule_sigmas(self, num_steps: int, shift: float) -> tuple[float, ...]:
        return tuple(reversed(super().schedule_sigmas(num_steps, shift)))


@pytest.mark.parametrize(
    ("backbone", "rule"),
    [(UncountedFlux, "nfe grew by"), (BatchMixingFlux, "other rows of its batch"), (RisingScheduleFlux, "strictly")],
)
def test_broken_backbones_are_caught(backbone: type, rule: str) -> None:
    config = backbone.Config(**BACKBONES["tiny_flux"]())
    with pytest.raises(ConformanceError, match=rule):
        check_backbone(lambda: backbone(config), WORLD_PROMPTS[:3])

