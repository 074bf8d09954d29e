"""ImageReward on tiny local weights in the released layout (tests/data/rewards/imagereward/, made by
scripts/make_tiny_reward_weights.py): the golden score, an independent forward from the raw checkpoint
tensors, the key renaming and its refusals, the start-up checks and the listing."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import ROOT, SCORE_TOL
from PIL import Image

from flowrl.core.registry import build
from flowrl.rewards.base import RewardConfigError
from flowrl.rewards.imagereward import center_crop_rounded, rename_key

DATA = ROOT / "tests" / "data" / "rewards"
FOLDER = DATA / "imagereward"
GOLDEN = json.loads((DATA / "golden.json").read_text())
PROMPTS = GOLDEN["prompts"]
SPEC = {
    "type": "imagereward",
    "checkpoint": str(FOLDER / "ImageReward.pt"),
    "med_config": str(FOLDER / "med_config.json"),
    "tokenizer": str(FOLDER / "tokenizer"),
    "vision_heads": 2,  # the tiny ViT's heads (the release's ViT-L has 16, the default)
    "device": "cpu",
}


def image() -> torch.Tensor:
    array = np.asarray(Image.open(DATA / "image.png").convert("RGB"), dtype=np.float32) / 255.0
    return torch.from_numpy(array).permute(2, 0, 1).unsqueeze(0)


def batch() -> torch.Tensor:
    return image().repeat(len(PROMPTS), 1, 1, 1)


def test_golden_scores_on_tiny_weights() -> None:
    reward = build("reward", SPEC)
    reward.check()
    scores = reward.score(batch(), list(PROMPTS))
    assert scores.dtype == torch.float32 and scores.shape == (len(PROMPTS),)
    # scores of about 0.07-0.21 from float32 sums over widths <= 128: machine-to-machine noise ~1e-7, well
    # inside rtol 1e-5 (+1e-6); a changed weight, token or crop moves them by 1e-3 or more
    np.testing.assert_allclose(scores.numpy(), GOLDEN["imagereward"], **SCORE_TOL)
    assert abs(GOLDEN["imagereward"][0] - GOLDEN["imagereward"][1]) > 0.1  # the prompt matters


# -- an independent forward: original key names, plain torch, no transformers, no renaming ----------------------
def _reference_pixels(side: int) -> torch.Tensor:
    """torchvision's Resize(side, BICUBIC) + CenterCrop(side) on a PIL image, ToTensor, CLIP mean/std."""
    pil = Image.open(DATA / "image.png").convert("RGB")
    w, h = pil.size
    size = (side, int(side * h / w)) if w <= h else (int(side * w / h), side)
    pil = pil.resize(size, resample=Image.Resampling.BICUBIC)
    left, top = int(round((pil.width - side) / 2.0)), int(round((pil.height - side) / 2.0))
    pil = pil.crop((left, top, left + side, top + side))
    x = torch.from_numpy(np.asarray(pil, dtype=np.float32) / 255.0).permute(2, 0, 1)
    mean = torch.tensor([0.48145466, 0.4578275, 0.40821073]).view(3, 1, 1)
    std = torch.tensor([0.26862954, 0.26130258, 0.27577711]).view(3, 1, 1)
    return ((x - mean) / std).unsqueeze(0)


def _wordpiece(word: str, vocab: dict[str, int]) -> list[int]:
    """Greedy longest-match-first pieces (``square`` + ``##s``)."""
    pieces, start = [], 0
    while start < len(word):
        end = len(word)
        while (word[start:end] if start == 0 else "##" + word[start:end]) not in vocab:
            end -= 1
        pieces.append(vocab[word[start:end] if start == 0 else "##" + word[start:end]])
        start = end
    return pieces


def _reference_ids(prompt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """[CLS] pieces [SEP], padded with [PAD] to 35 (the test prompts are lower-case letters and spaces)."""
    vocab = {w: i for i, w in enumerate((FOLDER / "tokenizer" / "vocab.txt").read_text().split("\n"))}
    ids = [vocab["[CLS]"], *(i for w in prompt.lower().split() for i in _wordpiece(w, vocab)), vocab["[SEP]"]]
    mask = [1] * len(ids) + [0] * (35 - len(ids))
    return torch.tensor([ids + [vocab["[PAD]"]] * (35 - len(ids))]), torch.tensor([mask])


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, bias: torch.Tensor | None = None):
    b, n, c = q.shape
    split = [t.reshape(b, t.shape[1], heads, c // heads).transpose(1, 2) for t in (q, k, v)]
    logits = split[0] @ split[1].transpose(-1, -2) / math.sqrt(c // heads)
    if bias is not None:
        logits = logits + bias
    return (logits.softmax(-1) @ split[2]).transpose(1, 2).reshape(b, n, c)


def _reference_score(sd: dict[str, torch.Tensor], pixels: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor):
    def lin(x, name):
        return x @ sd[name + ".weight"].T + sd[name + ".bias"]

    def ln(x, name, eps):
        return F.layer_norm(x, x.shape[-1:], sd[name + ".weight"], sd[name + ".bias"], eps)

    v = "blip.visual_encoder"
    patch = sd[f"{v}.patch_embed.proj.weight"]
    x = F.conv2d(pixels, patch, sd[f"{v}.patch_embed.proj.bias"], stride=patch.shape[-1]).flatten(2).transpose(1, 2)
    x = torch.cat([sd[f"{v}.cls_token"].expand(x.shape[0], -1, -1), x], 1) + sd[f"{v}.pos_embed"]
    depth = len({k.split(".")[3] for k in sd if k.startswith(f"{v}.blocks.")})
    for i in range(depth):  # pre-norm blocks; qkv packed as [q; k; v] along the output dimension
        blk = f"{v}.blocks.{i}"
        q, k, val = lin(ln(x, f"{blk}.norm1", 1e-6), f"{blk}.attn.qkv").chunk(3, dim=-1)
        x = x + lin(_attention(q, k, val, heads=2), f"{blk}.attn.proj")
        x = x + lin(F.gelu(lin(ln(x, f"{blk}.norm2", 1e-6), f"{blk}.mlp.fc1")), f"{blk}.mlp.fc2")
    image_tokens = ln(x, f"{v}.norm", 1e-6)

    t = "blip.text_encoder"
    h = (
        sd[f"{t}.embeddings.word_embeddings.weight"][ids]
        + sd[f"{t}.embeddings.position_embeddings.weight"][: ids.shape[1]]
    )
    h = ln(h, f"{t}.embeddings.LayerNorm", 1e-12)
    pad_bias = (1.0 - mask[:, None, None, :].float()) * -1e4  # BERT's additive padding mask
    layers = len({k.split(".")[4] for k in sd if k.startswith(f"{t}.encoder.layer.")})
    for i in range(layers):  # post-norm BERT layer: self-attention, cross-attention to every image token, FFN
        lay = f"{t}.encoder.layer.{i}"
        for block, source, bias in (("attention", h, pad_bias), ("crossattention", image_tokens, None)):
            q, k, val = (
                lin(inp, f"{lay}.{block}.self.{n}") for inp, n in ((h, "query"), (source, "key"), (source, "value"))
            )
            out = lin(_attention(q, k, val, heads=2, bias=bias), f"{lay}.{block}.output.dense")
            h = ln(h + out, f"{lay}.{block}.output.LayerNorm", 1e-12)
        out = lin(F.gelu(lin(h, f"{lay}.intermediate.dense")), f"{lay}.output.dense")
        h = ln(h + out, f"{lay}.output.LayerNorm", 1e-12)
    z = h[:, 0]  # the [CLS] position
    for index in (0, 2, 4, 6, 7):  # the MLP's linear layers (dropouts between are identities at eval)
        z = lin(z, f"mlp.layers.{index}")
    return (z[:, 0] - 0.16717362830052426) / 1.0333394966054072


def test_matches_an_independent_forward_of_the_raw_checkpoint() -> None:
    sd = torch.load(FOLDER / "ImageReward.pt", weights_only=True)
    pixels = _reference_pixels(32)
    expected = []
    for prompt in PROMPTS:
        ids, mask = _reference_ids(prompt)
        expected.append(_reference_score(sd, pixels, ids, mask))
    reward = build("reward", SPEC)
    ours = reward.score(batch(), list(PROMPTS))
    torch.testing.assert_close(ours, torch.cat(expected), **SCORE_TOL)
    model = reward.model()
    tokens = reward.tokens(list(PROMPTS), torch.device("cpu"))
    for i, prompt in enumerate(PROMPTS):  # the tokenizer agrees with the hand-made ids
        assert torch.equal(tokens[0][i], _reference_ids(prompt)[0][0])
    assert model.image_size == 32


def test_a_wrong_key_mapping_changes_the_score(tmp_path: Path) -> None:
    """The golden and the independent forward can fail: swapping q and k of one text layer moves the score."""
    sd = torch.load(FOLDER / "ImageReward.pt", weights_only=True)
    prefix = "blip.text_encoder.encoder.layer.0.attention.self"
    for kind in ("weight", "bias"):
        sd[f"{prefix}.query.{kind}"], sd[f"{prefix}.key.{kind}"] = (
            sd[f"{prefix}.key.{kind}"],
            sd[f"{prefix}.query.{kind}"],
        )
    torch.save(sd, tmp_path / "swapped.pt")
    scores = build("reward", {**SPEC, "checkpoint": str(tmp_path / "swapped.pt")}).score(batch(), list(PROMPTS))
    assert (scores - torch.tensor(GOLDEN["imagereward"])).abs().max() > 1e-3


def test_rename_key() -> None:
    assert rename_key("blip.visual_encoder.cls_token") == "vision.embeddings.class_embedding"
    assert rename_key("blip.visual_encoder.pos_embed") == "vision.embeddings.position_embedding"
    assert (
        rename_key("blip.visual_encoder.blocks.11.attn.proj.bias")
        == "vision.encoder.layers.11.self_attn.projection.bias"
    )
    assert rename_key("blip.visual_encoder.blocks.0.norm2.weight") == "vision.encoder.layers.0.layer_norm2.weight"
    assert rename_key("blip.visual_encoder.norm.weight") == "vision.post_layernorm.weight"
    key = "blip.text_encoder.encoder.layer.3.crossattention.self.key.weight"
    assert rename_key(key) == "text.encoder.layer.3.crossattention.self.key.weight"
    assert rename_key("mlp.layers.7.bias") == "head.7.bias"
    assert (
        rename_key("blip.vision_proj.weight") is None
        and rename_key("blip.text_encoder.embeddings.position_ids") is None
    )
    assert rename_key("blip.itm_head.weight") == "blip.itm_head.weight"  # unknown: left as is, then unexpected


def test_a_checkpoint_with_extra_or_missing_keys_is_refused(tmp_path: Path) -> None:
    sd = torch.load(FOLDER / "ImageReward.pt", weights_only=True)
    extra = tmp_path / "extra.pt"
    torch.save({**sd, "blip.itm_head.weight": torch.zeros(2, 24)}, extra)
    with pytest.raises(
        RewardConfigError, match=r"extra\.pt does not fit .*1 unexpected \(e\.g\. blip\.itm_head\.weight\)"
    ):
        build("reward", {**SPEC, "checkpoint": str(extra)}).score(batch(), list(PROMPTS))
    short = tmp_path / "short.pt"
    torch.save({k: v for k, v in sd.items() if "crossattention.self.value" not in k}, short)
    with pytest.raises(RewardConfigError, match=r"short\.pt does not fit .*4 missing \(e\.g\. text\.encoder"):
        build("reward", {**SPEC, "checkpoint": str(short)}).score(batch(), list(PROMPTS))
    other = tmp_path / "not_imagereward.pt"
    torch.save({"weight": torch.zeros(1)}, other)
    with pytest.raises(RewardConfigError, match=r"not_imagereward\.pt is not an ImageReward checkpoint"):
        build("reward", {**SPEC, "checkpoint": str(other)}).score(batch(), list(PROMPTS))


def test_tokens_truncate_at_35_and_batches_agree() -> None:
    reward = build("reward", SPEC)
    whole = reward.score(batch(), list(PROMPTS))
    ids, mask = reward.tokens(["a red circle " * 30], torch.device("cpu"))
    assert ids.shape == mask.shape == (1, 35) and int(mask.sum()) == 35
    assert ids[0, 0].item() == 2 and ids[0, -1].item() == 3  # [CLS] first (no [ENC]), [SEP] last
    one_by_one = build("reward", {**SPEC, "batch_size": 1}).score(batch(), list(PROMPTS))
    torch.testing.assert_close(whole, one_by_one, **SCORE_TOL)
    rescaled = build("reward", {**SPEC, "offset": 1.0, "scale": 2.0}).score(batch(), list(PROMPTS))
    torch.testing.assert_close(rescaled, (whole - 1.0) * 2.0)


def test_center_crop_rounds_like_torchvision() -> None:
    columns = torch.arange(37.0).view(1, 1, 1, 37).expand(1, 3, 32, 37)
    assert center_crop_rounded(columns, 32)[0, 0, 0, 0].item() == 2.0  # round(2.5) = 2 (floor would agree)
    columns = torch.arange(35.0).view(1, 1, 1, 35).expand(1, 3, 32, 35)
    assert center_crop_rounded(columns, 32)[0, 0, 0, 0].item() == 2.0  # round(1.5) = 2, where floor gives 1


# -- start-up checks and the listing ----------------------------------------------------------------------------
def _message(spec: dict) -> str:
    with pytest.raises(RewardConfigError) as info:
        build("reward", spec).check()
    assert "\n" not in str(info.value)
    return str(info.value)


def test_missing_paths_name_the_path_and_the_key(tmp_path: Path) -> None:
    missing = str(tmp_path / "ImageReward.pt")
    assert _message({**SPEC, "checkpoint": missing}) == (
        f"reward 'imagereward': weights not found at {missing} (set reward.checkpoint)"
    )
    med = str(tmp_path / "med_config.json")
    assert _message({**SPEC, "med_config": med}) == (
        f"reward 'imagereward': BLIP med config not found at {med} (set reward.med_config)"
    )
    tokenizer = str(tmp_path / "bert-base-uncased")
    assert _message({**SPEC, "tokenizer": tokenizer}) == (
        f"reward 'imagereward': tokenizer not found at {tokenizer} (set reward.tokenizer)"
    )
    assert "set reward.tokenizer" in _message({**SPEC, "tokenizer": str(tmp_path)})  # a folder without vocab.txt
    assert _message({"type": "imagereward"}) == (
        "reward 'imagereward': no weights configured (set reward.checkpoint to a local file)"
    )


def test_flowrl_ls_reward_lists_imagereward() -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "flowrl.cli.main", "ls", "reward"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    line = next(line for line in out.stdout.splitlines() if line.strip().startswith("imagereward "))
    assert "ImageReward" in line
