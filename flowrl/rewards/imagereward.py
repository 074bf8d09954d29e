"""ImageReward (Xu et al., NeurIPS 2023) rebuilt on transformers' BLIP classes (docs/rewards.md).

The released scorer is BLIP's image-grounded text encoder with a small MLP on top:

* image: a ViT-L/16 at 224 px (``BlipVisionModel``; its final LayerNorm applies to every token), fed with
  the image resized on its shortest side to 224 (PIL bicubic), centre-cropped to 224 x 224 (the offset
  rounded, as torchvision's ``CenterCrop`` does) and normalised with the CLIP mean/std;
* text: the prompt through the bert-base-uncased tokenizer (with BLIP's two added tokens), padded and truncated
  to 35 tokens, its first token left as [CLS]; a BERT (``BlipTextModel``, bidirectional) whose every layer
  cross-attends to all the image tokens;
* score: the text encoder's last hidden state at position 0 (float32) through the MLP (five linear layers,
  dropouts between the first four, no activations), then ``(mlp - 0.16717) / 1.03334``: roughly a standard
  normal over generated images, the number ``ImageReward.score`` returns.

The checkpoint is the released ``ImageReward.pt`` (original BLIP key names) renamed onto these modules by
:func:`rename_key`; a checkpoint that leaves a module key unfilled or has a key nothing uses is refused. The
vision tower's shape comes from the checkpoint's tensors, the text encoder's from ``med_config.json``.
"""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path
from typing import Any

import attrs
import torch
from attrs.validators import gt
from torch import Tensor, nn

from flowrl.core.choices import one_of
from flowrl.core.registry import register
from flowrl.rewards.base import DType, ModelReward, RewardConfigError, load_torch_file
from flowrl.rewards.preprocess import (
    CLIP_MEAN,
    CLIP_STD,
    Resize,
    normalize,
    resize_pil,
    resize_torch,
    resized_shape,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# Constants of the released ImageReward-v1.0 model (ImageReward/ImageReward.py in THUDM/ImageReward):
REWARD_MEAN = 0.16717362830052426  # the MLP output's mean over the training set, subtracted ...
REWARD_STD = 1.0333394966054072  # ... then divided by its standard deviation
MAX_LENGTH = 35  # the tokenizer call: padding="max_length", truncation=True, max_length=35
ADDED_TOKENS = ("[DEC]", "[ENC]")  # BLIP's tokenizer adds these (ids 30522, 30523 of bert-base-uncased)
VISION_EPS = 1e-6  # BLIP's timm-style ViT builds its LayerNorms with eps 1e-6
HEAD_DROPOUT = (0.2, 0.2, 0.1)  # the MLP's dropouts after its first three linear layers (inactive at eval)
MED_KEYS = (  # what the text encoder's shape needs from med_config.json
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "max_position_embeddings",
)

# Checkpoint keys the score never reads: BLIP's contrastive projections and the text position-id buffer.
UNUSED = re.compile(r"blip\.(vision_proj|text_proj)\.(weight|bias)|blip\.text_encoder\.embeddings\.position_ids")

# BLIP's ViT (original names) -> BlipVisionModel names; the per-block part, then the rest.
_BLOCK = {
    "norm1": "layer_norm1",
    "attn.qkv": "self_attn.qkv",
    "attn.proj": "self_attn.projection",
    "norm2": "layer_norm2",
    "mlp.fc1": "mlp.fc1",
    "mlp.fc2": "mlp.fc2",
}
_VISION = {
    "cls_token": "embeddings.class_embedding",
    "pos_embed": "embeddings.position_embedding",
    "patch_embed.proj.weight": "embeddings.patch_embedding.weight",
    "patch_embed.proj.bias": "embeddings.patch_embedding.bias",
    "norm.weight": "post_layernorm.weight",
    "norm.bias": "post_layernorm.bias",
}
_BLOCK_KEY = re.compile(r"blocks\.(\d+)\.(.+)\.(weight|bias)")
_HEAD_KEY = re.compile(r"mlp\.layers\.(\d+)\.(weight|bias)")


def rename_key(key: str) -> str | None:
    """The :class:`ImageRewardModel` key of one ``ImageReward.pt`` key; ``None`` for keys the score does not use.

    ``blip.visual_encoder.*`` -> ``vision.*`` (timm ViT names to ``BlipVisionModel`` names),
    ``blip.text_encoder.*`` -> ``text.*`` (BLIP's BERT and ``BlipTextModel`` share their names),
    ``mlp.layers.N.*`` -> ``head.N.*``. A key it does not know comes back unchanged (and is then unexpected).
    """
    if UNUSED.fullmatch(key):
        return None
    if key.startswith("blip.visual_encoder."):
        rest = key.removeprefix("blip.visual_encoder.")
        if rest in _VISION:
            return "vision." + _VISION[rest]
        match = _BLOCK_KEY.fullmatch(rest)
        if match and match.group(2) in _BLOCK:
            layer, part, kind = match.groups()
            return f"vision.encoder.layers.{layer}.{_BLOCK[part]}.{kind}"
        return key
    if key.startswith("blip.text_encoder."):
        return "text." + key.removeprefix("blip.text_encoder.")
    match = _HEAD_KEY.fullmatch(key)
    if match:
        return f"head.{match.group(1)}.{match.group(2)}"
    return key


def rename_state(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """The checkpoint's tensors under :class:`ImageRewardModel` names (the unused ones dropped)."""
    out = {}
    for key, value in state.items():
        new = rename_key(key)
        if new is not None:
            out[new] = value
    return out


def make_head(widths: tuple[int, ...]) -> nn.Sequential:
    """ImageReward's MLP layout: linear, dropout, linear, dropout, linear, dropout, linear, linear (indices
    0, 2, 4, 6, 7 hold the weights); ``widths`` = (input, then each linear's output), six numbers."""
    if len(widths) != 6:
        raise ValueError(f"the ImageReward head has five linear layers, got widths {widths}")
    linears = [nn.Linear(a, b) for a, b in zip(widths, widths[1:], strict=False)]
    parts: list[nn.Module] = []
    for i, linear in enumerate(linears):
        parts.append(linear)
        if i < len(HEAD_DROPOUT):
            parts.append(nn.Dropout(HEAD_DROPOUT[i]))
    return nn.Sequential(*parts)


class ImageRewardModel(nn.Module):
    """BLIP's ViT, BLIP's image-grounded BERT and the ImageReward head: normalised scores ``(B,)`` in float32."""

    def __init__(self, vision_config: Any, text_config: Any, head_widths: tuple[int, ...]) -> None:
        super().__init__()
        from transformers import BlipTextModel, BlipVisionModel

        self.vision = BlipVisionModel(vision_config)
        self.text = BlipTextModel(text_config, add_pooling_layer=False)
        self.head = make_head(head_widths)
        self.image_size = int(vision_config.image_size)

    def cls_features(self, pixels: Tensor, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """The text encoder's last hidden state at position 0 ([CLS]), cross-attending to every image token."""
        image_tokens = self.vision(pixel_values=pixels).last_hidden_state
        image_mask = torch.ones(image_tokens.shape[:2], dtype=torch.long, device=image_tokens.device)
        out = self.text(
            input_ids=input_ids,
            attention_mask=attention_mask,
            encoder_hidden_states=image_tokens,
            encoder_attention_mask=image_mask,
            is_decoder=False,
        )
        return out.last_hidden_state[:, 0, :].float()

    def forward(self, pixels: Tensor, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        raw = self.head(self.cls_features(pixels, input_ids, attention_mask))[:, 0]
        return (raw - REWARD_MEAN) / REWARD_STD


def center_crop_rounded(images: Tensor, side: int) -> Tensor:
    """The centre ``side x side`` with torchvision's ``CenterCrop`` offsets (``round((h - side) / 2)``)."""
    h, w = images.shape[-2:]
    top, left = int(round((h - side) / 2.0)), int(round((w - side) / 2.0))
    return images[..., top : top + side, left : left + side]


def preprocess(images: Tensor, size: int, backend: str) -> Tensor:
    """ImageReward's ``_transform(size)`` on ``(B, 3, H, W)`` images in [0, 1]: shortest side to ``size``
    (bicubic; PIL on the uint8 image, or antialiased on the tensor), centre crop, CLIP mean/std."""
    if images.dim() != 4 or images.shape[1] != 3:
        raise ValueError(f"expected images (B, 3, H, W), got shape {tuple(images.shape)}")
    out_h, out_w = resized_shape(images.shape[-2], images.shape[-1], size, "crop")
    resized = resize_pil(images, out_h, out_w) if backend == "pil" else resize_torch(images.float(), out_h, out_w)
    return normalize(center_crop_rounded(resized, size), CLIP_MEAN, CLIP_STD)


def vision_config_from(state: dict[str, Tensor], heads: int, where: str) -> Any:
    """A ``BlipVisionConfig`` read off the renamed checkpoint's shapes (width, depth, patch, image and MLP sizes)."""
    from transformers import BlipVisionConfig

    patch = state["vision.embeddings.patch_embedding.weight"]
    positions = state["vision.embeddings.position_embedding"].shape[1] - 1
    width, side = int(patch.shape[0]), int(round(positions**0.5))
    depth = len({k.split(".")[3] for k in state if k.startswith("vision.encoder.layers.")})
    if side * side != positions or width % heads:
        raise RewardConfigError(
            f"{where}: a ViT of width {width} with {positions} patches cannot take {heads} heads on a square grid "
            "(set reward.vision_heads)"
        )
    return BlipVisionConfig(
        hidden_size=width,
        intermediate_size=int(state["vision.encoder.layers.0.mlp.fc1.weight"].shape[0]),
        num_hidden_layers=depth,
        num_attention_heads=heads,
        image_size=side * int(patch.shape[-1]),
        patch_size=int(patch.shape[-1]),
        hidden_act="gelu",
        layer_norm_eps=VISION_EPS,
        attention_dropout=0.0,
    )


def text_config_from(med: dict[str, Any], encoder_width: int) -> Any:
    """A ``BlipTextConfig`` from BLIP's ``med_config.json`` (a BertConfig); cross-attention keys and values
    take the vision width, as BLIP sets ``encoder_width`` to it."""
    from transformers import BlipTextConfig

    return BlipTextConfig(
        vocab_size=int(med["vocab_size"]),
        hidden_size=int(med["hidden_size"]),
        encoder_hidden_size=encoder_width,
        intermediate_size=int(med["intermediate_size"]),
        num_hidden_layers=int(med["num_hidden_layers"]),
        num_attention_heads=int(med["num_attention_heads"]),
        max_position_embeddings=int(med["max_position_embeddings"]),
        hidden_act=str(med.get("hidden_act", "gelu")),
        layer_norm_eps=float(med.get("layer_norm_eps", 1e-12)),
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        pad_token_id=int(med.get("pad_token_id", 0)),
        bos_token_id=None,  # generation ids of BLIP's decoder: the encoder never reads them
        eos_token_id=None,
        sep_token_id=None,
        is_decoder=True,  # builds the cross-attention layers; the forward runs bidirectionally (is_decoder=False)
    )


def load_tokenizer(folder: str) -> Any:
    """The BERT tokenizer of a local folder, with BLIP's two added special tokens."""
    from transformers import BertTokenizer

    tokenizer = BertTokenizer.from_pretrained(str(Path(folder).expanduser()), local_files_only=True)
    tokenizer.add_tokens(list(ADDED_TOKENS), special_tokens=True)
    return tokenizer


@register("reward", "imagereward")
class ImageReward(ModelReward):
    """ImageReward: BLIP image-grounded text encoder + MLP, normalised (about -2 to 2; ImageReward-v1.0)."""

    @attrs.frozen
    class Config:
        checkpoint: str = ""  # local ImageReward.pt (THUDM/ImageReward); never downloaded
        med_config: str = ""  # local med_config.json of the same release (the BLIP text encoder's BERT config)
        tokenizer: str = ""  # local bert-base-uncased tokenizer folder (vocab.txt or tokenizer.json)
        vision_heads: int = attrs.field(default=16, validator=gt(0))  # ViT heads (ImageReward's ViT-L/16: 16)
        scale: float = 1.0  # reported = (raw - offset) * scale
        offset: float = 0.0
        device: str = "auto"  # auto: the images' device, else cuda if available, else cpu
        dtype: DType = attrs.field(
            default="float32", validator=one_of(DType)
        )  # the ViT's and the BERT's; the [CLS] feature, head and normalisation stay float32
        batch_size: int = attrs.field(default=32, validator=gt(0))  # images per forward
        resize: Resize = attrs.field(
            default="pil", validator=one_of(Resize)
        )  # pil: PIL bicubic on the uint8 image, as the release; torch: antialiased bicubic on the device

    def check_paths(self) -> None:
        self.require_file(self.config.checkpoint, "checkpoint")
        self.require_file(self.config.med_config, "med_config", "BLIP med config")
        folder = self.config.tokenizer
        if not folder:
            raise RewardConfigError(f"{self.label}: no tokenizer configured (set reward.tokenizer to a local folder)")
        path = Path(folder).expanduser()
        if not path.is_dir():
            raise RewardConfigError(f"{self.label}: tokenizer not found at {folder} (set reward.tokenizer)")
        if not ((path / "vocab.txt").is_file() or (path / "tokenizer.json").is_file()):
            raise RewardConfigError(
                f"{self.label}: {folder} has no vocab.txt (set reward.tokenizer to a bert-base-uncased folder)"
            )

    def _med_config(self) -> dict[str, Any]:
        path = self.config.med_config
        try:
            med = json.loads(Path(path).expanduser().read_text())
        except (OSError, ValueError) as error:
            raise RewardConfigError(f"{self.label}: cannot read {path} ({error}) (set reward.med_config)") from None
        if not isinstance(med, dict):
            raise RewardConfigError(f"{self.label}: {path} is not a JSON object (set reward.med_config)")
        for key in MED_KEYS:
            if key not in med:
                raise RewardConfigError(f"{self.label}: {path} lacks {key} (set reward.med_config)")
        return med

    def _checkpoint(self) -> dict[str, Tensor]:
        path = self.config.checkpoint
        try:
            state = load_torch_file(path)
        except (OSError, RuntimeError, ValueError, EOFError, pickle.UnpicklingError) as error:
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise RewardConfigError(f"{self.label}: cannot read {path} ({first})") from None
        if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
            raise RewardConfigError(f"{self.label}: {path} is not a state dict of tensors (set reward.checkpoint)")
        renamed = rename_state(state)
        needed = (
            "vision.embeddings.patch_embedding.weight",
            "vision.embeddings.position_embedding",
            "vision.encoder.layers.0.mlp.fc1.weight",
            *(f"head.{i}.weight" for i in (0, 2, 4, 6, 7)),
        )
        absent = [k for k in needed if k not in renamed]
        if absent:
            raise RewardConfigError(
                f"{self.label}: {path} is not an ImageReward checkpoint (nothing maps to {absent[0]}; "
                "expected blip.visual_encoder.*, blip.text_encoder.*, mlp.layers.*)"
            )
        return renamed

    def load(self, device: torch.device) -> ImageRewardModel:
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
        state = self._checkpoint()
        vision = vision_config_from(state, self.config.vision_heads, self.label)
        text = text_config_from(self._med_config(), int(vision.hidden_size))
        widths = (
            int(state["head.0.weight"].shape[1]),
            *(int(state[f"head.{i}.weight"].shape[0]) for i in (0, 2, 4, 6, 7)),
        )
        model = ImageRewardModel(vision, text, widths)
        expected = set(model.state_dict())
        missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
        if missing or unexpected:
            parts = [f"{len(missing)} missing (e.g. {missing[0]})"] if missing else []
            parts += [f"{len(unexpected)} unexpected (e.g. {unexpected[0]})"] if unexpected else []
            raise RewardConfigError(
                f"{self.label}: {self.config.checkpoint} does not fit ImageReward with {self.config.med_config}: "
                f"{', '.join(parts)} keys after renaming"
            )
        try:
            model.load_state_dict(state, strict=True)
        except RuntimeError as error:
            lines = [line.strip() for line in str(error).splitlines() if "size mismatch" in line] or [str(error)]
            raise RewardConfigError(
                f"{self.label}: {self.config.checkpoint} does not fit {self.config.med_config} ({lines[0]})"
            ) from None
        self._tokenizer = load_tokenizer(self.config.tokenizer)
        if len(self._tokenizer) > text.vocab_size:
            raise RewardConfigError(
                f"{self.label}: the tokenizer at {self.config.tokenizer} has {len(self._tokenizer)} tokens but "
                f"{self.config.med_config} says vocab_size {text.vocab_size} (set reward.tokenizer)"
            )
        dtype = DTYPES[self.config.dtype]
        model.vision.to(dtype)
        model.text.to(dtype)
        return model.to(device).eval().requires_grad_(False)

    def tokens(self, prompts: list[str], device: torch.device) -> tuple[Tensor, Tensor]:
        """ImageReward's tokenisation: padded and truncated to 35 tokens, [CLS] first (not replaced by [ENC])."""
        out = self._tokenizer(
            list(prompts), padding="max_length", truncation=True, max_length=MAX_LENGTH, return_tensors="pt"
        )
        return out["input_ids"].to(device), out["attention_mask"].to(device)

    @torch.no_grad()
    def score(self, images: Tensor, prompts: list[str]) -> Tensor:
        chunks = self.batches(images, prompts, self.config.batch_size)
        model = self.model(images)
        device, dtype = self.device, DTYPES[self.config.dtype]
        out = []
        for part in chunks:
            pixels = preprocess(images[part].to(device), model.image_size, self.config.resize).to(dtype)
            ids, mask = self.tokens(list(prompts[part]), device)
            out.append(model(pixels, ids, mask))
        return self.rescale(torch.cat(out) if out else torch.zeros(0))
