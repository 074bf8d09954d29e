"""Build the tiny reward weights the golden tests use, and record their scores (tests/data/rewards/).

    .venv/bin/python scripts/make_tiny_reward_weights.py clip        # image, tiny CLIP, aesthetic head
    .nox/extras/bin/python scripts/make_tiny_reward_weights.py hps   # tiny open_clip config + HPS checkpoint

Everything is seeded, so a rebuild writes the same weights; the files are committed and the tests only read
them. The scores are computed through the registered rewards (the same code path as the real weights) and
written to ``golden.json`` beside the weights: the tests assert them to a relative 1e-5 (``SCORE_TOL`` in
tests/conftest.py: float32 scores move by about 1e-6 between machines). ``clip`` runs in the main
environment; ``hps`` needs hpsv2 (the ``extras`` nox session's environment). Keep the folder under 2 MB.
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

    from flowrl.backbones.tokenizer import BOS_ID, DEFAULT_WORDS, EOS_ID, PAD_ID, build_word_tokenizer

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


def scores(part: str) -> dict[str, list[float]]:
    from flowrl.registry import build

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
    }[part]
    images = load_image().repeat(len(PROMPTS), 1, 1, 1)
    out = {}
    for name, spec in specs.items():
        out[name] = [float(s) for s in build("reward", {"device": "cpu", **spec}).score(images, list(PROMPTS))]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=("clip", "hps"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    DATA.mkdir(parents=True, exist_ok=True)
    if args.part == "clip":
        make_image()
        make_clip()
    else:
        make_hps()
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
