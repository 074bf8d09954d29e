"""Build the tiny reward weights the golden tests use, and record their scores (tests/data/rewards/).

    .venv/bin/python scripts/make_tiny_reward_weights.py clip        # image, tiny CLIP, aesthetic head
    .nox/extras/bin/python scripts/make_tiny_reward_weights.py hps   # tiny open_clip config + HPS checkpoint
    .venv/bin/python scripts/make_tiny_reward_weights.py imagereward # tiny ImageReward.pt, med config, tokenizer

Everything is seeded, so a rebuild writes the same weights; the files are committed and the tests only read
them. The scores are computed through the registered rewards (the same code path as the real weights) and
written to ``golden.json`` beside the weights: the tests assert them to a relative 1e-5 (``SCORE_TOL`` in
tests/conftest.py: float32 scores move by about 1e-6 between machines). ``clip`` runs in the main
environment; ``hps`` needs hpsv2 (the ``extras`` nox session's environment); ``imagereward`` runs in the main
environment and writes its checkpoint directly in the released key layout (no ImageReward code involved).
Keep the folder under 2 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image, ImageDraw  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "rewards"
IMAGE = DATA / "image.png"
GOLDEN = DATA / "golden.json"
PROMPTS = ("a red circle on a blue sky", "two green squares")
HPS_NAME = "tiny-hps"
HPS_CONFIG = {  # an open_clip CLIP config: ViT-H-14's layout, tiny widths (the text vocabulary must stay 49408)
    "embed_dim": 8,
    "vision_cfg": {"image_size": 224, "layers": 1, "width": 16, "head_width": 8, "patch_size": 32},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 8, "heads": 2, "layers": 1},
}

# ImageReward at tiny sizes, the release's layout: ViT (real: width 1024, 24 blocks, 16 heads, patch 16 at 224 px),
# BERT with cross-attention (real: 768 wide, 12 layers), head (real: 768 -> 1024 -> 128 -> 64 -> 16 -> 1).
IR_VISION = {"width": 32, "depth": 2, "heads": 2, "patch": 8, "image": 32, "mlp": 128, "proj": 8}
IR_MED = {  # med_config.json's keys, tiny values; vocab_size = the tokenizer's words + [DEC] + [ENC], as 30522 + 2
    "architectures": ["BertModel"],
    "attention_probs_dropout_prob": 0.1,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 24,
    "initializer_range": 0.02,
    "intermediate_size": 96,
    "layer_norm_eps": 1e-12,
    "max_position_embeddings": 40,
    "model_type": "bert",
    "num_attention_heads": 2,
    "num_hidden_layers": 2,
    "pad_token_id": 0,
    "type_vocab_size": 2,
    "encoder_width": 32,
    "add_cross_attention": True,
}
IR_HEAD = (24, 32, 16, 8, 4, 1)
IR_TEXT = "a an the of on in with and that says sign photo painting red green blue yellow circle square sky cat dog"
IR_WORDS = (*IR_TEXT.split(), "two", "three", "one", "big", "small")


def make_image() -> None:
    """A 48 x 64 (H x W) RGB picture: a gradient sky, a red disc and a green square (not square on purpose)."""
    h, w = 48, 64
    y, x = np.mgrid[0:h, 0:w]
    sky = np.stack([40 + 2 * x, 90 + y, 200 - x], axis=-1).clip(0, 255).astype(np.uint8)
    img = Image.fromarray(sky)
    draw = ImageDraw.Draw(img)
    draw.ellipse((8, 10, 30, 32), fill=(220, 30, 30))
    draw.rectangle((40, 20, 56, 36), fill=(30, 180, 60))
    img.save(IMAGE, optimize=True)


def load_image() -> torch.Tensor:
    array = np.asarray(Image.open(IMAGE).convert("RGB"), dtype=np.float32) / 255.0
    return torch.from_numpy(array).permute(2, 0, 1).unsqueeze(0)


def make_clip() -> None:
    """A tiny transformers CLIPModel + word-level tokenizer + preprocessor config, and an aesthetic head."""
    from transformers import CLIPConfig, CLIPModel

    from flowrl.backbones.common.tokenizer import BOS_ID, DEFAULT_WORDS, EOS_ID, PAD_ID, build_word_tokenizer

    folder = DATA / "clip"
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = build_word_tokenizer(DEFAULT_WORDS, max_length=16)
    ids = {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID}
    config = CLIPConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "max_position_embeddings": 16,
            **ids,
        },
        vision_config={
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": 224,
            "patch_size": 32,
        },
        projection_dim=8,
    )
    torch.manual_seed(0)
    model = CLIPModel(config).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    processor = {  # the CLIP processor's settings (openai/clip-vit-large-patch14's values)
        "image_processor_type": "CLIPImageProcessor",
        "do_resize": True,
        "size": {"shortest_edge": 224},
        "resample": 3,
        "do_center_crop": True,
        "crop_size": {"height": 224, "width": 224},
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "do_convert_rgb": True,
    }
    (folder / "preprocessor_config.json").write_text(json.dumps(processor, indent=2) + "\n")

    # The LAION predictor's layout (linear, dropout, linear, dropout, linear, dropout, linear, linear) at tiny widths.
    torch.manual_seed(1)
    widths = (8, 16, 8, 4, 2, 1)
    lin = [torch.nn.Linear(a, b) for a, b in zip(widths, widths[1:], strict=False)]
    drop = torch.nn.Dropout(0.1)
    head = torch.nn.Module()
    head.layers = torch.nn.Sequential(lin[0], drop, lin[1], drop, lin[2], drop, lin[3], lin[4])
    torch.save(head.state_dict(), DATA / "aesthetic_head.pth")


def make_hps() -> None:
    """The tiny open_clip config and an HPS-format checkpoint ({"state_dict": ...}) built by hpsv2's code."""
    from flowrl.rewards.hps import ensure_vocab

    ensure_vocab()
    from hpsv2.src.open_clip import add_model_config, create_model

    folder = DATA / "hps"
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / f"{HPS_NAME}.json"
    config.write_text(json.dumps(HPS_CONFIG, indent=2) + "\n")
    add_model_config(str(config))
    torch.manual_seed(0)
    model = create_model(HPS_NAME, None, precision="fp32", device="cpu", output_dict=True)
    with torch.no_grad():  # a non-trivial logit scale and projections, as a trained checkpoint has
        model.logit_scale.fill_(4.0)
    state = {k: v.detach().half() for k, v in model.state_dict().items()}  # fp16 keeps the file under 1 MB
    torch.save({"state_dict": state}, folder / "tiny_hps.pt")


def tiny_bert_vocab() -> list[str]:
    """bert-base-uncased's special tokens, a few words, every letter and every ``##`` letter (nothing is [UNK])."""
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *IR_WORDS]
    words += [c for c in letters if c not in words] + [f"##{c}" for c in letters]
    return words


def imagereward_state(vocab_size: int) -> dict[str, torch.Tensor]:
    """Random tensors under the released ImageReward.pt key names (BLIP's timm ViT, BLIP's BERT, the MLP)."""
    g = torch.Generator().manual_seed(0)
    state: dict[str, torch.Tensor] = {}

    def randn(*shape: int, std: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * std

    def linear(name: str, fan_in: int, fan_out: int) -> None:
        state[f"{name}.weight"] = randn(fan_out, fan_in, std=fan_in**-0.5)
        state[f"{name}.bias"] = randn(fan_out, std=0.1)

    def layer_norm(name: str, width: int) -> None:
        state[f"{name}.weight"] = 1.0 + randn(width, std=0.1)
        state[f"{name}.bias"] = randn(width, std=0.1)

    v, w = "blip.visual_encoder", IR_VISION["width"]
    patches = (IR_VISION["image"] // IR_VISION["patch"]) ** 2
    state[f"{v}.cls_token"] = randn(1, 1, w, std=0.5)
    state[f"{v}.pos_embed"] = randn(1, patches + 1, w, std=0.5)
    state[f"{v}.patch_embed.proj.weight"] = randn(w, 3, IR_VISION["patch"], IR_VISION["patch"], std=0.1)
    state[f"{v}.patch_embed.proj.bias"] = randn(w, std=0.1)
    for i in range(IR_VISION["depth"]):
        b = f"{v}.blocks.{i}"
        layer_norm(f"{b}.norm1", w)
        linear(f"{b}.attn.qkv", w, 3 * w)
        linear(f"{b}.attn.proj", w, w)
        layer_norm(f"{b}.norm2", w)
        linear(f"{b}.mlp.fc1", w, IR_VISION["mlp"])
        linear(f"{b}.mlp.fc2", IR_VISION["mlp"], w)
    layer_norm(f"{v}.norm", w)

    t, h, inner = "blip.text_encoder", IR_MED["hidden_size"], IR_MED["intermediate_size"]
    positions = IR_MED["max_position_embeddings"]
    state[f"{t}.embeddings.position_ids"] = torch.arange(positions).unsqueeze(0)
    state[f"{t}.embeddings.word_embeddings.weight"] = randn(vocab_size, h, std=0.5)
    state[f"{t}.embeddings.position_embeddings.weight"] = randn(positions, h, std=0.2)
    layer_norm(f"{t}.embeddings.LayerNorm", h)
    for i in range(IR_MED["num_hidden_layers"]):
        layer = f"{t}.encoder.layer.{i}"
        for block, width in (("attention", h), ("crossattention", w)):
            linear(f"{layer}.{block}.self.query", h, h)
            linear(f"{layer}.{block}.self.key", width, h)
            linear(f"{layer}.{block}.self.value", width, h)
            linear(f"{layer}.{block}.output.dense", h, h)
            layer_norm(f"{layer}.{block}.output.LayerNorm", h)
        linear(f"{layer}.intermediate.dense", h, inner)
        linear(f"{layer}.output.dense", inner, h)
        layer_norm(f"{layer}.output.LayerNorm", h)
    linear("blip.vision_proj", w, IR_VISION["proj"])  # BLIP's contrastive projections: saved, never used
    linear("blip.text_proj", h, IR_VISION["proj"])
    for index, (a, b) in zip((0, 2, 4, 6, 7), zip(IR_HEAD, IR_HEAD[1:], strict=False), strict=True):
        linear(f"mlp.layers.{index}", a, b)
    return state


def make_imagereward() -> None:
    """A tiny ImageReward.pt (original key names), its med_config.json and a bert-uncased tokenizer folder."""
    folder = DATA / "imagereward"
    tokenizer = folder / "tokenizer"
    tokenizer.mkdir(parents=True, exist_ok=True)
    vocab = tiny_bert_vocab()
    (tokenizer / "vocab.txt").write_text("\n".join(vocab) + "\n")
    settings = {"do_lower_case": True, "model_max_length": 512, "tokenizer_class": "BertTokenizer"}
    (tokenizer / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n")
    med = {**IR_MED, "vocab_size": len(vocab) + 2}
    (folder / "med_config.json").write_text(json.dumps(med, indent=2) + "\n")
    torch.save(imagereward_state(med["vocab_size"]), folder / "ImageReward.pt")


def imagereward_spec() -> dict[str, object]:
    folder = DATA / "imagereward"
    return {
        "type": "imagereward",
        "checkpoint": str(folder / "ImageReward.pt"),
        "med_config": str(folder / "med_config.json"),
        "tokenizer": str(folder / "tokenizer"),
        "vision_heads": IR_VISION["heads"],
        "device": "cpu",
    }


def scores(part: str) -> dict[str, list[float]]:
    from flowrl.core.registry import build

    clip = str(DATA / "clip")
    specs = {
        "clip": {
            "pickscore": {"type": "pickscore", "model": clip, "processor": clip, "device": "cpu"},
            "clipscore": {"type": "clipscore", "model": clip, "device": "cpu"},
            "aesthetic": {"type": "aesthetic", "model": clip, "head": str(DATA / "aesthetic_head.pth")},
        },
        "hps": {
            "hpsv2": {
                "type": "hpsv2",
                "checkpoint": str(DATA / "hps" / "tiny_hps.pt"),
                "model": HPS_NAME,
                "model_config": str(DATA / "hps" / f"{HPS_NAME}.json"),
                "device": "cpu",
            }
        },
        "imagereward": {"imagereward": imagereward_spec()},
    }[part]
    images = load_image().repeat(len(PROMPTS), 1, 1, 1)
    out = {}
    for name, spec in specs.items():
        out[name] = [float(s) for s in build("reward", {"device": "cpu", **spec}).score(images, list(PROMPTS))]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=("clip", "hps", "imagereward"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    DATA.mkdir(parents=True, exist_ok=True)
    if args.part == "clip":
        make_image()
        make_clip()
    elif args.part == "hps":
        make_hps()
    else:
        make_imagereward()
    golden = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    golden["prompts"] = list(PROMPTS)
    golden.update(scores(args.part))
    GOLDEN.write_text(json.dumps(golden, indent=2, sort_keys=True) + "\n")
    print(json.dumps({k: v for k, v in golden.items() if k != "prompts"}, indent=2))
    total = sum(f.stat().st_size for f in DATA.rglob("*") if f.is_file())
    print(f"{DATA.relative_to(ROOT)}: {total / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
