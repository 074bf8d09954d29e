"""HPSv2.1 through the hpsv2 package's own model code (the ``hps`` extra; docs/rewards.md).

The model is built by ``hpsv2.src.open_clip.create_model_and_transforms`` with no pretrained tag (nothing is
downloaded) and the HPS state dict is loaded from ``checkpoint`` (``HPS_v2.1_compressed.pt``), as hpsv2's
``img_score`` does after its download. Score = ``image_features . text_features`` (both L2-normalised by the
model; no logit scale), about 0.25-0.37 on FLUX outputs. Preprocessing is hpsv2's ``preprocess_val``:
longest side resized to 224 (bicubic, antialiased, on the tensor), zero-padded to a square, CLIP mean/std.

hpsv2's wheel lacks its tokenizer vocabulary (``bpe_simple_vocab_16e6.txt.gz``); the same file ships in
``open-clip-torch``, and is copied next to hpsv2's tokenizer on first load when it is missing.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from typing import Any, Literal

import attrs
import torch
from attrs.validators import gt
from torch import Tensor

from flowrl.core.choices import one_of
from flowrl.core.registry import register
from flowrl.rewards.base import DType, ModelReward, RewardConfigError
from flowrl.rewards.preprocess import ImagePreprocess

VOCAB = "bpe_simple_vocab_16e6.txt.gz"
INSTALL = "pip install -e '.[hps]' && pip install --no-deps hpsv2==1.2.0 in a flowrl checkout"
Resize = Literal["torch", "pil"]  # preprocess.Resize, hpsv2's own back-end first
AUTOCAST = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def _package_dir(name: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def vocab_paths() -> tuple[Path | None, Path | None]:
    """(where hpsv2's tokenizer reads its vocabulary, open_clip's copy of it), without importing either."""
    hps, oc = _package_dir("hpsv2"), _package_dir("open_clip")
    return (hps / "src" / "open_clip" / VOCAB if hps else None), (oc / VOCAB if oc else None)


def ensure_vocab() -> None:
    """Put open_clip's tokenizer vocabulary where hpsv2 looks for it (hpsv2's wheel lacks it)."""
    target, source = vocab_paths()
    if target is None or target.is_file():
        return
    if source is None or not source.is_file():
        raise RewardConfigError(
            f"reward 'hpsv2': hpsv2 lacks {VOCAB}; install open-clip-torch, which ships it ({INSTALL})"
        )
    try:
        shutil.copyfile(source, target)
    except OSError as error:
        message = f"reward 'hpsv2': cannot copy {source} to {target} ({error}); copy it by hand"
        raise RewardConfigError(message) from None


@register("reward", "hpsv2")
class HPSv2(ModelReward):
    """HPSv2.1: image-text feature dot product of OpenCLIP ViT-H-14 with the HPS v2.1 weights (about 0.25-0.37)."""

    extra = "hps"
    modules = ("hpsv2", "torchvision", "ftfy", "regex", "clint")
    install_hint = INSTALL

    @attrs.frozen
    class Config:
        checkpoint: str = ""  # local HPS_v2.1_compressed.pt (or HPS_v2_compressed.pt for v2.0); never downloaded
        model: str = "ViT-H-14"  # open_clip architecture name (hpsv2's bundled configs, or model_config's)
        model_config: str = ""  # an open_clip model config JSON to register first (its file stem is its name)
        scale: float = 1.0  # reported = (raw - offset) * scale
        offset: float = 0.0
        device: str = "auto"  # auto: the images' device, else cuda if available, else cpu
        dtype: DType = attrs.field(
            default="float32", validator=one_of(DType)
        )  # float16 / bfloat16: autocast on CUDA (hpsv2 scores under fp16 autocast)
        batch_size: int = attrs.field(default=32, validator=gt(0))  # images per forward
        resize: Resize = attrs.field(default="torch", validator=one_of(Resize))

    def check(self) -> None:
        super().check()
        target, source = vocab_paths()
        if target is not None and not target.is_file() and (source is None or not source.is_file()):
            raise RewardConfigError(
                f"{self.label} needs the 'hps' extra: hpsv2 lacks {VOCAB}, which open-clip-torch ships ({INSTALL})"
            )

    def check_paths(self) -> None:
        self.require_file(self.config.checkpoint, "checkpoint")
        if self.config.model_config:
            self.require_file(self.config.model_config, "model_config", "model config")

    def load(self, device: torch.device) -> Any:
        ensure_vocab()
        from hpsv2.src.open_clip import add_model_config, create_model_and_transforms, get_tokenizer

        if self.config.model_config:
            add_model_config(str(Path(self.config.model_config).expanduser()))
        try:  # the arguments of hpsv2's img_score, less the pretrained tag (its weights are replaced anyway)
            model, _, _ = create_model_and_transforms(
                self.config.model,
                None,
                precision="fp32",
                device=device,
                jit=False,
                force_quick_gelu=False,
                force_custom_text=False,
                force_patch_dropout=False,
                force_image_size=None,
                pretrained_image=False,
                image_mean=None,
                image_std=None,
                light_augmentation=True,
                aug_cfg={},
                output_dict=True,
                with_score_predictor=False,
                with_region_predictor=False,
            )
        except RuntimeError as error:
            raise RewardConfigError(f"{self.label}: {error} (set reward.model or reward.model_config)") from None
        checkpoint = torch.load(str(Path(self.config.checkpoint).expanduser()), map_location="cpu", weights_only=True)
        state = checkpoint["state_dict"] if isinstance(checkpoint, dict) and "state_dict" in checkpoint else checkpoint
        try:
            model.load_state_dict(state)
        except RuntimeError as error:
            first = str(error).strip().splitlines()[0]
            raise RewardConfigError(
                f"{self.label}: {self.config.checkpoint} does not fit model '{self.config.model}' ({first})"
            ) from None
        model.to(device).eval().requires_grad_(False)
        size = model.visual.image_size
        side = int(size[0] if isinstance(size, (tuple, list)) else size)
        self._preprocess = ImagePreprocess(
            size=side,
            crop=side,
            mean=tuple(model.visual.image_mean),
            std=tuple(model.visual.image_std),
            fit="pad",
            backend=self.config.resize,
        )
        self._tokenizer = get_tokenizer(self.config.model)
        return model

    @torch.no_grad()
    def score(self, images: Tensor, prompts: list[str]) -> Tensor:
        chunks = self.batches(images, prompts, self.config.batch_size)
        model = self.model(images)
        device = self.device
        out = []
        for part in chunks:
            pixels = self._preprocess(images[part].to(device))
            text = self._tokenizer(list(prompts[part])).to(device)
            dtype = AUTOCAST.get(self.config.dtype)
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None and device.type == "cuda"):
                features = model(pixels, text)
            out.append((features["image_features"].float() * features["text_features"].float()).sum(-1))
        return self.rescale(torch.cat(out) if out else torch.zeros(0))
