"""The ``flowrl-reward`` wire format: how images, prompts, condition images and scores travel between a trainer
and a reward server (docs/rewards.md gives the schema a reward service can implement).

Plain JSON both ways, never pickle (unpickling runs code of the sender's choosing). Images go as base64 in one of
two lossless encodings:

- ``png``: 8-bit RGB PNG of ``round(255 x)``; lossless for the 8-bit image a reward model usually reads, and
  about a third of the raw size for typical renders;
- ``float32``: the ``(3, H, W)`` tensor's raw little-endian float32 bytes; exact (the server scores the very
  tensor the trainer made), four bytes a value.

Two versions. ``flowrl-reward/1`` carries the results and their prompts' text; ``flowrl-reward/2`` adds each
prompt's **condition images** (an edit's source image, flowrl.core.conditions), for a reward that scores a result
against them. A request (``POST /score``, and ``POST /metrics`` for evaluation figures)::

    {"protocol": "flowrl-reward/1" | "flowrl-reward/2", "prompts": [str], "metadata": [object | null] (optional),
     "images": [{"encoding": "png", "data": b64} | {"encoding": "float32", "shape": [3, H, W], "data": b64}],
     "conditions": [[{"encoding": "png", "data": b64}, ...], ...]   (version 2 only: one list per prompt)}

A condition image is a PNG of its own pixels, in its own size and mode (RGB, RGBA or L: what the prompt file
held, exactly), at most :data:`MAX_CONDITIONS` a prompt and :data:`MAX_SIDE` pixels a side. A version-2 server
decodes them back into :class:`~flowrl.core.conditions.Prompt` objects, equal to the trainer's. A request without
``protocol`` is version 1.

Answer of ``/score``: ``{"scores": [float], "components": {name: [float]}}`` (``components`` optional), one score
per image; a score that is not finite travels as ``null`` (JSON has no NaN) and the client refuses it. Answer of
``/metrics``: ``{"metrics": {name: float}}``. An error is any non-2xx status with ``{"error": "message"}``.
This module holds the encoding and the strict checks both sides share; it needs no server library.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import math
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from flowrl.core.choices import values
from flowrl.core.conditions import MODES, Condition, Prompt, conditions_of
from flowrl.core.errors import UserError

PROTOCOL = "flowrl-reward/1"  # results and their prompts' text
PROTOCOL_CONDITIONS = "flowrl-reward/2"  # version 1 and each prompt's condition images
PROTOCOLS = (PROTOCOL, PROTOCOL_CONDITIONS)
Encoding = Literal["png", "float32"]  # how an image travels
ENCODINGS = values(Encoding)
MAX_SIDE = 8192  # pixels: larger images are refused before any decoding (a PNG can claim any size)
MAX_CONDITIONS = 8  # condition images a prompt may carry


class WireError(UserError, ValueError):
    """A message that does not follow the protocol; the text says which field and why (the client reports it as
    a :class:`flowrl.rewards.http.RemoteRewardError` naming the server, the server answers 400)."""


# -- images -------------------------------------------------------------------------------------------------
def encode_image(image: Tensor, encoding: str) -> dict[str, Any]:
    """One ``(3, H, W)`` image in [0, 1] as a JSON-safe dict in ``encoding``."""
    if image.dim() != 3 or image.shape[0] != 3:
        raise WireError(f"an image must have shape (3, H, W), not {tuple(image.shape)}")
    pixels = image.detach().float().cpu()
    if encoding == "float32":
        raw = pixels.contiguous().numpy().astype("<f4", copy=False).tobytes()
        return {"encoding": "float32", "shape": list(pixels.shape), "data": base64.b64encode(raw).decode("ascii")}
    if encoding == "png":
        from PIL import Image

        array = (pixels.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
        buffer = io.BytesIO()
        Image.fromarray(array, mode="RGB").save(buffer, format="PNG", compress_level=1)  # 1: fast, still lossless
        return {"encoding": "png", "data": base64.b64encode(buffer.getvalue()).decode("ascii")}
    raise WireError(f"unknown image encoding {encoding!r} (one of {', '.join(ENCODINGS)})")


def png_roundtrip(images: Tensor) -> Tensor:
    """What a server decodes from ``png``-encoded ``images``: each value rounded to the nearest 1/255."""
    return (images.detach().float().clamp(0, 1) * 255).round() / 255


def decode_image(item: Any, index: int) -> Tensor:
    """The ``(3, H, W)`` float32 tensor of one encoded image; :class:`WireError` naming ``images[index]``."""
    where = f"images[{index}]"
    if not isinstance(item, dict) or not isinstance(item.get("data"), str):
        raise WireError(f"{where} must be an object with a base64 string 'data'")
    try:
        raw = base64.b64decode(item["data"], validate=True)
    except (binascii.Error, ValueError):
        raise WireError(f"{where}.data is not valid base64") from None
    encoding = item.get("encoding")
    if encoding == "float32":
        shape = item.get("shape")
        if not (isinstance(shape, list) and len(shape) == 3 and all(isinstance(n, int) and n > 0 for n in shape)):
            raise WireError(f"{where}.shape must be [3, H, W] of positive integers")
        if shape[0] != 3 or max(shape[1:]) > MAX_SIDE:
            raise WireError(f"{where}.shape {shape} is not [3, H, W] with H, W <= {MAX_SIDE}")
        if len(raw) != 4 * math.prod(shape):
            raise WireError(f"{where}: {len(raw)} bytes of data for shape {shape} ({4 * math.prod(shape)} expected)")
        return torch.from_numpy(np.frombuffer(raw, dtype="<f4").astype(np.float32).reshape(shape))
    if encoding == "png":
        return _decode_png(raw, where)
    raise WireError(f"{where}.encoding must be one of {', '.join(ENCODINGS)}, not {encoding!r}")


def _decode_png(raw: bytes, where: str) -> Tensor:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(raw), formats=["PNG"]) as image:
            if max(image.size) > MAX_SIDE:
                raise WireError(f"{where}: a {image.size[0]}x{image.size[1]} image is larger than {MAX_SIDE} px")
            array = np.asarray(image.convert("RGB"), dtype=np.uint8)
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as error:
        if isinstance(error, WireError):
            raise
        raise WireError(f"{where} is not a readable PNG ({type(error).__name__})") from None
    return torch.from_numpy(array.copy()).permute(2, 0, 1).float() / 255


# -- condition images -----------------------------------------------------------------------------------------
def encode_condition(condition: Condition) -> dict[str, Any]:
    """One condition image as a PNG of its own pixels, size and mode (lossless)."""
    from PIL import Image

    if max(condition.size) > MAX_SIDE:
        width, height = condition.size
        raise WireError(f"a {width}x{height} condition image is larger than the protocol's {MAX_SIDE} px")
    pixels = np.asarray(condition.pixels)
    buffer = io.BytesIO()
    Image.fromarray(pixels[:, :, 0] if condition.mode == "L" else pixels, mode=condition.mode).save(
        buffer, format="PNG", compress_level=1
    )
    return {"encoding": "png", "data": base64.b64encode(buffer.getvalue()).decode("ascii")}


def decode_condition(item: Any, where: str) -> Condition:
    """A :class:`~flowrl.core.conditions.Condition` from its encoding; :class:`WireError` naming ``where``."""
    from PIL import Image, UnidentifiedImageError

    if not isinstance(item, dict) or not isinstance(item.get("data"), str):
        raise WireError(f"{where} must be an object with a base64 string 'data'")
    if item.get("encoding", "png") != "png":
        raise WireError(f"{where}.encoding must be 'png' (a condition image travels as a PNG of its own pixels)")
    try:
        raw = base64.b64decode(item["data"], validate=True)
    except (binascii.Error, ValueError):
        raise WireError(f"{where}.data is not valid base64") from None
    try:
        with Image.open(io.BytesIO(raw), formats=["PNG"]) as image:
            if max(image.size) > MAX_SIDE:
                raise WireError(f"{where}: a {image.size[0]}x{image.size[1]} image is larger than {MAX_SIDE} px")
            if image.mode not in MODES:
                raise WireError(f"{where}: a {image.mode} PNG; a condition image is {', '.join(MODES)}")
            mode, pixels = image.mode, np.asarray(image, dtype=np.uint8)
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as error:
        if isinstance(error, WireError):
            raise
        raise WireError(f"{where} is not a readable PNG ({type(error).__name__})") from None
    return Condition(pixels, mode)


def _conditions(body: dict[str, Any], prompts: list[str]) -> list[str]:
    """The prompts of a version-2 body with their condition images."""
    lists = body.get("conditions")
    if not isinstance(lists, list) or len(lists) != len(prompts):
        raise WireError(f"'conditions' must be a list with one list of images per prompt ({len(prompts)})")
    out: list[str] = []
    for i, (text, items) in enumerate(zip(prompts, lists, strict=True)):
        if not isinstance(items, list):
            raise WireError(f"conditions[{i}] must be a list of images (empty: the prompt has none)")
        if len(items) > MAX_CONDITIONS:
            raise WireError(f"conditions[{i}] holds {len(items)} images; at most {MAX_CONDITIONS} a prompt")
        out.append(Prompt(text, [decode_condition(item, f"conditions[{i}][{k}]") for k, item in enumerate(items)]))
    return out


# -- requests -----------------------------------------------------------------------------------------------
def score_request(images: Tensor, prompts: list[str], encoding: str,
                  metadata: list[dict[str, Any] | None] | None = None, conditions: bool = False) -> dict[str, Any]:
    """The JSON body of a ``/score`` (or ``/metrics``) request for a batch ``(B, 3, H, W)``; with ``conditions``
    a version-2 body carrying each prompt's condition images."""
    body: dict[str, Any] = {"protocol": PROTOCOL_CONDITIONS if conditions else PROTOCOL,
                            "prompts": [str(p) for p in prompts],
                            "images": [encode_image(image, encoding) for image in images]}
    if metadata is not None:
        body["metadata"] = metadata
    if conditions:
        body["conditions"] = [[encode_condition(c) for c in conditions_of(p)] for p in prompts]
    return body


def parse_request(body: Any) -> tuple[Tensor, list[str], list[dict[str, Any] | None]]:
    """The images ``(B, 3, H, W)``, prompts (carrying their condition images in version 2) and metadata of a
    request body; :class:`WireError` if malformed."""
    if not isinstance(body, dict):
        raise WireError("the body must be a JSON object")
    protocol = body.get("protocol", PROTOCOL)
    if protocol not in PROTOCOLS:
        raise WireError(f"protocol {protocol!r} is not one of {', '.join(map(repr, PROTOCOLS))}")
    if protocol == PROTOCOL and "conditions" in body:
        raise WireError(f"'conditions' needs protocol {PROTOCOL_CONDITIONS!r} (this body says {PROTOCOL!r})")
    images, prompts = body.get("images"), body.get("prompts")
    if not isinstance(images, list) or not images:
        raise WireError("'images' must be a non-empty list")
    if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
        raise WireError("'prompts' must be a list of strings")
    if len(prompts) != len(images):
        raise WireError(f"{len(images)} images but {len(prompts)} prompts")
    metadata = body.get("metadata")
    if metadata is None:
        metadata = [None] * len(images)
    elif not isinstance(metadata, list) or len(metadata) != len(images):
        raise WireError("'metadata' must be a list with one object (or null) per image")
    elif not all(m is None or isinstance(m, dict) for m in metadata):
        raise WireError("every 'metadata' entry must be an object or null")
    if protocol == PROTOCOL_CONDITIONS:
        prompts = _conditions(body, prompts)
    decoded = [decode_image(item, i) for i, item in enumerate(images)]
    shapes = {tuple(t.shape) for t in decoded}
    if len(shapes) != 1:
        raise WireError(f"the images of one request must share one size (got {sorted(shapes)})")
    return torch.stack(decoded), prompts, metadata


# -- answers ------------------------------------------------------------------------------------------------
def _finite_or_null(values: Tensor) -> list[float | None]:
    return [float(v) if math.isfinite(float(v)) else None for v in values.detach().double().cpu().flatten()]


def score_answer(scores: Tensor, components: dict[str, Tensor] | None = None) -> dict[str, Any]:
    """The JSON answer of ``/score``: non-finite values become ``null``."""
    answer: dict[str, Any] = {"scores": _finite_or_null(scores)}
    if components:
        answer["components"] = {name: _finite_or_null(values) for name, values in components.items()}
    return answer


def _refuse_constant(name: str) -> float:
    raise WireError(f"the answer holds {name}, which JSON does not allow (send null)")


def loads(text: str | bytes) -> Any:
    """Strict JSON: ``NaN`` and ``Infinity`` tokens are refused like any other malformed text."""
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise WireError(f"the answer is not JSON ({error})") from None


def _floats(values: Any, count: int, field: str) -> Tensor:
    if not isinstance(values, list):
        raise WireError(f"'{field}' must be a list of numbers")
    if len(values) != count:
        raise WireError(f"'{field}' holds {len(values)} values for {count} images")
    for i, value in enumerate(values):
        if value is None:
            raise WireError(f"{field}[{i}] is null: the server's reward gave NaN or inf for that image")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise WireError(f"{field}[{i}] is {value!r}, not a number")
    return torch.tensor(values, dtype=torch.float64).float()


def parse_score_answer(answer: Any, count: int) -> tuple[Tensor, dict[str, Tensor]]:
    """Scores ``(count,)`` and named components of a ``/score`` answer; :class:`WireError` for anything else."""
    if not isinstance(answer, dict) or "scores" not in answer:
        raise WireError("the answer must be a JSON object with 'scores'")
    scores = _floats(answer["scores"], count, "scores")
    components = answer.get("components") or {}
    if not isinstance(components, dict):
        raise WireError("'components' must be an object of lists")
    return scores, {str(k): _floats(v, count, f"components.{k}") for k, v in components.items()}


def parse_metrics_answer(answer: Any) -> dict[str, float]:
    """The figures of a ``/metrics`` answer (null stays NaN: an evaluation figure may be undefined)."""
    metrics = answer.get("metrics") if isinstance(answer, dict) else None
    if not isinstance(metrics, dict):
        raise WireError("the answer must be a JSON object with 'metrics'")
    out = {}
    for key, value in metrics.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise WireError(f"metrics.{key} is {value!r}, not a number")
        out[str(key)] = math.nan if value is None else float(value)
    return out
