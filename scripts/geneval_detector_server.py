"""Serve GenEval's detector for `flowrl suite run geneval --set detector="http://HOST:PORT"`.

Runs in GenEval's own environment (Python 3.10 with its pinned torch, mmcv-full, mmdet 2 and open-clip-torch, and
its Mask2Former weights; see docs/evaluation.md), never in flowrl's: it imports nothing of flowrl, only the standard
library, numpy and Pillow at the top, and the detector's packages once ``--config`` is given.

    python scripts/geneval_detector_server.py --config mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco.py \\
        --checkpoint mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco.pth --port 8700

Contract (flowrl's wire encoding of images)::

    GET  /health  ->  {"ok": true, "detector": NAME}
    POST /detect  {"images": [{"encoding": "png", "data": BASE64}, ...], "prompts": [...]}
              ->  {"detections": [[{"label", "box": [x1, y1, x2, y2], "score", "color"}, ...], ...]}

one list per image: every detection scoring above 0.3 with its COCO class name, its box in pixels, its confidence,
and the colour CLIP ViT-L/14 gives its instance mask composited over flat grey (#999) and cropped to its box, among
GenEval's ten colours, from the mean of three prompt templates' text embeddings. flowrl applies GenEval's rules
(thresholds, counting, positions, colours) to these detections.

Binds 127.0.0.1 unless told otherwise; the detector is the expensive part: give the GPU with --device.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import sys
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

COLOURS = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white")
TEMPLATES = ("a photo of a {c} {object}", "a photo of a {c}-colored {object}", "a photo of a {c} object")
KEEP_ABOVE = 0.3  # the lowest threshold GenEval's rules use; the rules apply the stricter ones
MAX_BODY = 256 << 20

Detect = Callable[[Sequence[np.ndarray]], list[list[dict[str, Any]]]]


def decode(item: Any) -> np.ndarray:
    """An ``(H, W, 3)`` uint8 image from a wire item (PNG only: what flowrl's detector client sends)."""
    from PIL import Image

    if not isinstance(item, dict) or item.get("encoding") != "png" or not isinstance(item.get("data"), str):
        raise ValueError("each image must be {\"encoding\": \"png\", \"data\": BASE64}")
    with Image.open(io.BytesIO(base64.b64decode(item["data"], validate=True))) as image:
        return np.asarray(image.convert("RGB"))


def handler(detect: Detect, name: str) -> type[BaseHTTPRequestHandler]:
    """The request handler serving ``detect``."""

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
            if self.path == "/health":
                self._answer(200, {"ok": True, "detector": name})
            else:
                self._answer(404, {"error": f"no {self.path}; GET /health or POST /detect"})

        def do_POST(self) -> None:  # noqa: N802
            if self.path != "/detect":
                self._answer(404, {"error": f"no {self.path}; POST /detect"})
                return
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                self._answer(413, {"error": f"body of {length} bytes is over {MAX_BODY}"})
                return
            try:
                body = json.loads(self.rfile.read(length))
                images = [decode(item) for item in body["images"]]
            except (KeyError, TypeError, ValueError) as error:
                self._answer(400, {"error": f"bad request: {error}"})
                return
            self._answer(200, {"detections": detect(images)})

        def log_message(self, *args: Any) -> None:
            if not getattr(self.server, "quiet", False):
                super().log_message(*args)

    return Handler


def mmdet_detector(config: str, checkpoint: str, device: str, clip_model: str = "ViT-L-14") -> Detect:
    """GenEval's Mask2Former (mmdet 2) and CLIP colour classifier. Needs GenEval's environment; not exercised by
    flowrl's tests (they serve the same contract with the embedded world's detector)."""
    import open_clip
    import torch
    from mmdet.apis import inference_detector, init_detector
    from PIL import Image

    model = init_detector(config, checkpoint, device=device)
    classes = list(model.CLASSES)
    clip, _, preprocess = open_clip.create_model_and_transforms(clip_model, pretrained="openai", device=device)
    tokenizer = open_clip.get_tokenizer(clip_model)
    text_cache: dict[str, torch.Tensor] = {}

    @torch.no_grad()
    def colour_embeddings(label: str) -> torch.Tensor:
        if label not in text_cache:
            rows = []
            for colour in COLOURS:
                tokens = tokenizer([t.format(c=colour, object=label) for t in TEMPLATES]).to(device)
                found = clip.encode_text(tokens).float()
                found = found / found.norm(dim=-1, keepdim=True)
                mean = found.mean(0)
                rows.append(mean / mean.norm())
            text_cache[label] = torch.stack(rows)
        return text_cache[label]

    @torch.no_grad()
    def colour(image: np.ndarray, mask: np.ndarray, box: Sequence[float], label: str) -> str:
        grey = np.full_like(image, 0x99)
        composite = np.where(mask[..., None], image, grey)
        x1, y1, x2, y2 = (int(round(v)) for v in box)
        crop = Image.fromarray(composite[max(y1, 0) : max(y2, y1 + 1), max(x1, 0) : max(x2, x1 + 1)])
        feature = clip.encode_image(preprocess(crop)[None].to(device)).float()
        feature = feature / feature.norm(dim=-1, keepdim=True)
        return COLOURS[int((feature @ colour_embeddings(label).T).argmax())]

    def detect(images: Sequence[np.ndarray]) -> list[list[dict[str, Any]]]:
        out = []
        for image in images:
            boxes, masks = inference_detector(model, image[..., ::-1].copy())  # mmdet reads BGR
            found = []
            for index, label in enumerate(classes):
                for row, mask in zip(boxes[index], masks[index], strict=True):
                    if float(row[4]) > KEEP_ABOVE:
                        box = [float(v) for v in row[:4]]
                        found.append({"label": label, "box": box, "score": float(row[4]),
                                      "color": colour(image, np.asarray(mask, dtype=bool), box, label)})
            out.append(found)
        return out

    return detect


def serve(
    detect: Detect, name: str, host: str = "127.0.0.1", port: int = 8700, quiet: bool = False
) -> ThreadingHTTPServer:
    """A server answering the contract with ``detect`` (call ``serve_forever()`` on it)."""
    server = ThreadingHTTPServer((host, port), handler(detect, name))
    server.quiet = quiet  # type: ignore[attr-defined]
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="the Mask2Former config file (GenEval's)")
    parser.add_argument("--checkpoint", required=True, help="its weights (.pth)")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8700)
    parser.add_argument("--quiet", action="store_true", help="no access log")
    args = parser.parse_args(argv)
    server = serve(mmdet_detector(args.config, args.checkpoint, args.device), "mask2former", args.host, args.port,
                   args.quiet)
    print(f"GenEval detector on http://{args.host}:{args.port} (POST /detect)", file=sys.stderr)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
