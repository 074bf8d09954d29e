"""CLIP-based rewards on transformers' ``CLIPModel``: PickScore, CLIPScore and the LAION aesthetic predictor.

Each loads a ``CLIPModel`` (``save_pretrained`` folder or hub id; the hub only when not offline), its
tokenizer and the image preprocessing of its ``preprocessor_config.json`` (shortest side resized bicubic,
centre crop, CLIP mean/std), done here in PIL/torch (:mod:`flowrl.rewards.preprocess`), so no torchvision.
Embeddings are the projected pooled outputs (``get_image_features`` / ``get_text_features``), L2-normalised.

* ``pickscore``: ``logit_scale.exp() * cos(image, text)`` (about 18-23 for PickScore_v1).
* ``clipscore``: ``cos(image, text)``.
* ``aesthetic``: a linear (or stacked-linear) head on the normalised image embedding (the LAION predictor).

Every one reports ``(raw - offset) * scale``; the defaults (0, 1) leave the raw number (docs/rewards.md).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import attrs
import torch
from attrs.validators import gt
from torch import Tensor

from flowrl.core.choices import one_of
from flowrl.core.registry import register
from flowrl.rewards.base import DType, ModelReward, RewardConfigError, load_torch_file
from flowrl.rewards.preprocess import CLIP_MEAN, CLIP_STD, ImagePreprocess, Resize

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _size(value: Any, default: int) -> int:
    if isinstance(value, int):
        return value
    if isinstance(value, dict):
        for key in ("shortest_edge", "height", "width"):
            if key in value:
                return int(value[key])
    return default


def image_preprocess(settings: dict[str, Any], backend: str) -> ImagePreprocess:
    """The preprocessing a ``preprocessor_config.json`` describes (CLIP's defaults where it is silent)."""
    size = _size(settings.get("size"), 224)
    crop = _size(settings.get("crop_size"), size) if settings.get("do_center_crop", True) else size
    return ImagePreprocess(
        size=size,
        crop=crop,
        mean=tuple(settings.get("image_mean", CLIP_MEAN)),
        std=tuple(settings.get("image_std", CLIP_STD)),
        fit="crop",
        backend=backend,  # type: ignore[arg-type]
    )


def _read_preprocessor_config(name: str) -> dict[str, Any]:
    local = Path(name).expanduser()
    if local.is_dir():
        path = local / "preprocessor_config.json"
        return json.loads(path.read_text()) if path.is_file() else {}
    from transformers.utils import cached_file

    found = cached_file(name, "preprocessor_config.json", _raise_exceptions_for_missing_entries=False)
    return json.loads(Path(found).read_text()) if found else {}


@attrs.frozen
class ClipBundle:
    """A loaded CLIP model with its tokenizer and preprocessing."""

    model: Any
    tokenizer: Any
    preprocess: ImagePreprocess
    max_length: int
    dtype: torch.dtype


def load_clip(model_name: str, processor_name: str, device: torch.device, dtype: str, backend: str) -> ClipBundle:
    from transformers import AutoTokenizer, CLIPModel
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    name = str(Path(model_name).expanduser()) if Path(model_name).expanduser().exists() else model_name
    proc = processor_name or model_name
    proc = str(Path(proc).expanduser()) if Path(proc).expanduser().exists() else proc
    model = CLIPModel.from_pretrained(name, dtype=DTYPES[dtype]).to(device).eval()
    model.requires_grad_(False)
    tokenizer = AutoTokenizer.from_pretrained(proc)
    limit = int(getattr(model.config.text_config, "max_position_embeddings", 77))
    max_length = min(77, limit, int(getattr(tokenizer, "model_max_length", limit) or limit))
    preprocess = image_preprocess(_read_preprocessor_config(proc), backend)
    return ClipBundle(model, tokenizer, preprocess, max_length, DTYPES[dtype])


def image_embeddings(bundle: ClipBundle, images: Tensor, device: torch.device) -> Tensor:
    """L2-normalised projected image embeddings ``(B, D)`` in float32."""
    pixels = bundle.preprocess(images.to(device)).to(bundle.dtype)
    pooled = bundle.model.vision_model(pixel_values=pixels).pooler_output
    return torch.nn.functional.normalize(bundle.model.visual_projection(pooled).float(), dim=-1)


def text_embeddings(bundle: ClipBundle, prompts: list[str], device: torch.device) -> Tensor:
    """L2-normalised projected text embeddings ``(B, D)`` in float32."""
    tokens = bundle.tokenizer(
        list(prompts), padding=True, truncation=True, max_length=bundle.max_length, return_tensors="pt"
    )
    out = bundle.model.text_model(
        input_ids=tokens["input_ids"].to(device), attention_mask=tokens["attention_mask"].to(device)
    )
    return torch.nn.functional.normalize(bundle.model.text_projection(out.pooler_output).float(), dim=-1)


class _ClipReward(ModelReward):
    """Shared loading and batching of the CLIP rewards."""

    def check_paths(self) -> None:
        self.require_model(self.config.model, "model")
        if getattr(self.config, "processor", ""):
            self.require_model(self.config.processor, "processor")

    def load(self, device: torch.device) -> ClipBundle:
        processor = getattr(self.config, "processor", "") or self.config.model
        return load_clip(self.config.model, processor, device, self.config.dtype, self.config.resize)

    def raw(self, bundle: ClipBundle, images: Tensor, prompts: list[str]) -> Tensor:
        raise NotImplementedError

    @torch.no_grad()
    def score(self, images: Tensor, prompts: list[str]) -> Tensor:
        chunks = self.batches(images, prompts, self.config.batch_size)
        bundle = self.model(images)
        parts = [self.raw(bundle, images[s], prompts[s]) for s in chunks]
        return self.rescale(torch.cat(parts) if parts else torch.zeros(0))


@register("reward", "pickscore")
class PickScore(_ClipReward):
    """PickScore: logit_scale * cos(CLIP image, text) of PickScore_v1 (raw about 18-23; papers rescale it)."""

    extra = "clip"

    @attrs.frozen
    class Config:
        model: str = "yuvalkirstain/PickScore_v1"  # CLIPModel folder or hub id
        processor: str = "laion/CLIP-ViT-H-14-laion2B-s32B-b79K"  # tokenizer + preprocessor_config.json
        scale: float = 1.0  # reported = (raw - offset) * scale; Flow-GRPO: scale = 1/26
        offset: float = 0.0  # e.g. offset = 18, scale = 0.125 for (s - 18) / 8
        device: str = "auto"  # auto: the images' device, else cuda if available, else cpu
        dtype: DType = attrs.field(default="float32", validator=one_of(DType))
        batch_size: int = attrs.field(default=32, validator=gt(0))  # images per forward
        resize: Resize = attrs.field(default="pil", validator=one_of(Resize))

    def raw(self, bundle: ClipBundle, images: Tensor, prompts: list[str]) -> Tensor:
        cos = (image_embeddings(bundle, images, self.device) * text_embeddings(bundle, prompts, self.device)).sum(-1)
        return bundle.model.logit_scale.exp().float() * cos


@register("reward", "clipscore")
class ClipScore(_ClipReward):
    """CLIPScore: cos(CLIP image embedding, text embedding) (Hessel et al. report 2.5 * max(cos, 0))."""

    extra = "clip"

    @attrs.frozen
    class Config:
        model: str = "openai/clip-vit-large-patch14"  # CLIPModel folder or hub id (also its tokenizer)
        scale: float = 1.0  # reported = (raw - offset) * scale; CLIPScore paper: 2.5
        offset: float = 0.0
        device: str = "auto"  # auto: the images' device, else cuda if available, else cpu
        dtype: DType = attrs.field(default="float32", validator=one_of(DType))
        batch_size: int = attrs.field(default=32, validator=gt(0))  # images per forward
        resize: Resize = attrs.field(default="pil", validator=one_of(Resize))

    def raw(self, bundle: ClipBundle, images: Tensor, prompts: list[str]) -> Tensor:
        return (image_embeddings(bundle, images, self.device) * text_embeddings(bundle, prompts, self.device)).sum(-1)


def linear_stack(state: dict[str, Tensor]) -> list[tuple[Tensor, Tensor]]:
    """The ``(weight, bias)`` pairs of a head saved as one ``nn.Linear`` (``weight``, ``bias``) or as an
    ``nn.Sequential`` of linears and dropouts (``layers.0.weight`` ...; the LAION v2 predictor), in order."""
    state = {k.removeprefix("module."): v for k, v in state.items()}
    if "weight" in state and "bias" in state:
        return [(state["weight"].float(), state["bias"].float())]
    indexed: dict[tuple[str, int], dict[str, Tensor]] = {}
    for key, value in state.items():
        match = re.fullmatch(r"(.*?)(\d+)\.(weight|bias)", key)
        if not match:
            raise ValueError(f"unexpected key '{key}' in an aesthetic head (expected linear layers)")
        indexed.setdefault((match.group(1), int(match.group(2))), {})[match.group(3)] = value.float()
    layers = []
    for _, params in sorted(indexed.items(), key=lambda item: item[0][1]):
        if "weight" not in params or params["weight"].dim() != 2:
            raise ValueError("an aesthetic head must hold linear layers (2-D weights)")
        layers.append((params["weight"], params.get("bias", torch.zeros(params["weight"].shape[0]))))
    for (w0, _), (w1, _) in zip(layers, layers[1:], strict=False):
        if w0.shape[0] != w1.shape[1]:
            raise ValueError(f"aesthetic head layers do not chain: {tuple(w0.shape)} then {tuple(w1.shape)}")
    if not layers or layers[-1][0].shape[0] != 1:
        raise ValueError("an aesthetic head must end in one output")
    return layers


@register("reward", "aesthetic")
class Aesthetic(_ClipReward):
    """LAION aesthetic predictor: a linear head on the normalised CLIP ViT-L/14 image embedding (about 1-10)."""

    extra = "clip"

    @attrs.frozen
    class Config:
        head: str = ""  # the head's weights (.pth or .safetensors), e.g. sac+logos+ava1-l14-linearMSE.pth
        model: str = "openai/clip-vit-large-patch14"  # the CLIP the head was trained on
        scale: float = 1.0  # reported = (raw - offset) * scale
        offset: float = 0.0
        device: str = "auto"  # auto: the images' device, else cuda if available, else cpu
        dtype: DType = attrs.field(default="float32", validator=one_of(DType))
        batch_size: int = attrs.field(default=32, validator=gt(0))  # images per forward
        resize: Resize = attrs.field(default="pil", validator=one_of(Resize))

    def check_paths(self) -> None:
        self.require_file(self.config.head, "head", "aesthetic head")
        super().check_paths()

    def load(self, device: torch.device) -> ClipBundle:
        bundle = super().load(device)
        try:
            layers = linear_stack(load_torch_file(self.config.head))
        except (ValueError, RuntimeError) as error:
            raise RewardConfigError(f"{self.label}: cannot use {self.config.head} as a head: {error}") from error
        width = int(bundle.model.config.projection_dim)
        if layers[0][0].shape[1] != width:
            raise RewardConfigError(
                f"{self.label}: the head takes {layers[0][0].shape[1]}-d embeddings but {self.config.model} "
                f"gives {width}-d (pair the head with the CLIP it was trained on)"
            )
        self._head = [(w.to(device), b.to(device)) for w, b in layers]
        return bundle

    def raw(self, bundle: ClipBundle, images: Tensor, prompts: list[str]) -> Tensor:
        x = image_embeddings(bundle, images, self.device)
        for weight, bias in self._head:
            x = x @ weight.T + bias
        return x[:, 0]
