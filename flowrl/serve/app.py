"""The reward server's HTTP application (FastAPI, run by uvicorn): ``GET /health``, ``POST /score``,
``POST /metrics`` of one reward, speaking :mod:`flowrl.rewards.wire`.

Versions: the server reads both ``flowrl-reward/1`` and ``/2`` requests. A reward that needs each prompt's condition
images (``RewardModel.needs_conditions``, an edit reward) says so at ``/health`` (``protocol``
``flowrl-reward/2``, ``needs_conditions: true``, which an older, version-1 client refuses by name) and answers 400
to a request whose prompt has none; any other reward reports ``protocol`` ``flowrl-reward/1`` as before and scores
the results alone (the condition images of a version-2 request reach it with the prompts, unread).

Safety: the body is JSON read by the strict checks of :mod:`flowrl.rewards.wire` (no pickle, no code from the
client); a body over ``max_body_bytes`` is refused with 413 before it is read in full, a malformed one with 400,
and the server keeps serving. With a token every request, health included, needs ``Authorization: Bearer
<token>`` (401 otherwise). The reward runs on one worker thread at a time (one model, one device), so the event
loop keeps answering health checks and refusals while a batch is scored.
"""

from __future__ import annotations

import hmac
import inspect
import json
import math
import threading
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from torch import Tensor

import flowrl
from flowrl.core.conditions import conditions_of
from flowrl.core.convert import unstructure
from flowrl.core.interfaces import RewardModel
from flowrl.rewards.wire import (
    ENCODINGS,
    MAX_CONDITIONS,
    MAX_SIDE,
    PROTOCOL,
    PROTOCOL_CONDITIONS,
    PROTOCOLS,
    WireError,
    parse_request,
    score_answer,
)

DEFAULT_MAX_BODY = 256 * 1024 * 1024  # bytes: 64 PNG images of 1024 px with room to spare


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def metadata_keys(reward: RewardModel) -> list[str]:
    """What per-sample metadata the reward reads: a ``metadata_keys`` attribute, if it declares one."""
    return [str(k) for k in getattr(reward, "metadata_keys", ())]


def create_app(reward: RewardModel, name: str, token: str = "", max_body_bytes: int = DEFAULT_MAX_BODY) -> FastAPI:
    """The application serving ``reward`` (registered as ``name``); ``token``: required bearer token ("" none)."""
    app = FastAPI(title=f"flowrl reward server: {name}", docs_url=None, redoc_url=None, openapi_url=None)
    lock = threading.Lock()
    takes_metadata = "metadata" in inspect.signature(reward.score).parameters
    needs_conditions = bool(type(reward).needs_conditions(reward.config))
    health = {
        "protocol": PROTOCOL_CONDITIONS if needs_conditions else PROTOCOL,
        "protocols": list(PROTOCOLS),
        "needs_conditions": needs_conditions,
        "reward": name,
        "class": f"{type(reward).__module__}:{type(reward).__qualname__}",
        "version": flowrl.__version__,
        "config": unstructure(reward.config),
        "needs": {"images": "RGB (3, H, W) in [0, 1], one size per request", "prompts": "one per image",
                  "metadata": metadata_keys(reward),
                  "conditions": (f"each prompt's condition images ({PROTOCOL_CONDITIONS}: PNG, RGB, RGBA or L, at most "
                                 f"{MAX_CONDITIONS} a prompt, {MAX_SIDE} px a side)") if needs_conditions else "none"},
        "encodings": list(ENCODINGS),
        "max_body_bytes": max_body_bytes,
    }

    def authorised(request: Request) -> bool:
        if not token:
            return True
        given = request.headers.get("authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())

    async def read_body(request: Request) -> Any:
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > max_body_bytes):
            raise _Refused(413, f"the body is over the server's limit of {max_body_bytes} bytes")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_body_bytes:
                raise _Refused(413, f"the body is over the server's limit of {max_body_bytes} bytes")
            chunks.append(chunk)

        def refuse(constant: str) -> Any:
            raise _Refused(400, f"the body holds {constant}, which JSON does not allow")

        try:
            return json.loads(b"".join(chunks), parse_constant=refuse)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise _Refused(400, f"the body is not JSON ({error})") from None

    def run_reward(body: Any, metrics: bool) -> dict[str, Any]:
        images, prompts, metadata = parse_request(body)
        if needs_conditions:
            missing = next((i for i, p in enumerate(prompts) if not conditions_of(p)), None)
            if missing is not None:
                raise _Refused(400, f"reward '{name}' needs each prompt's condition images (protocol "
                                    f"{PROTOCOL_CONDITIONS!r} with 'conditions'); prompts[{missing}] has none")
        with lock:
            try:
                if metrics:
                    figures = reward.eval_metrics(images, prompts)
                    return {"metrics": {k: float(v) if math.isfinite(float(v)) else None for k, v in figures.items()}}
                score: Any = reward.score
                scores = score(images, prompts, metadata=metadata) if takes_metadata else score(images, prompts)
            except WireError:
                raise
            except Exception as error:
                raise _Refused(500, f"reward '{name}' failed: {type(error).__name__}: {error}") from None
        if not isinstance(scores, Tensor) or tuple(scores.shape) != (images.shape[0],):
            shape = tuple(scores.shape) if isinstance(scores, Tensor) else type(scores).__name__
            raise _Refused(500, f"reward '{name}' returned {shape}, not one score per image")
        components = getattr(reward, "components", None)  # optional named components of the last batch
        named = {k: v for k, v in components.items() if isinstance(v, Tensor) and v.shape == scores.shape} \
            if isinstance(components, dict) else None
        return score_answer(scores, named)

    async def handle(request: Request, metrics: bool) -> JSONResponse:
        if not authorised(request):
            return _error(401, "missing or wrong bearer token (Authorization: Bearer <FLOWRL_SERVE_TOKEN>)")
        try:
            body = await read_body(request)
            return JSONResponse(await run_in_threadpool(run_reward, body, metrics))
        except _Refused as refused:
            return _error(refused.status, str(refused))
        except WireError as error:
            return _error(400, str(error))

    @app.get("/health")
    async def get_health(request: Request) -> JSONResponse:
        if not authorised(request):
            return _error(401, "missing or wrong bearer token (Authorization: Bearer <FLOWRL_SERVE_TOKEN>)")
        return JSONResponse(health)

    @app.post("/score")
    async def post_score(request: Request) -> JSONResponse:
        return await handle(request, metrics=False)

    @app.post("/metrics")
    async def post_metrics(request: Request) -> JSONResponse:
        return await handle(request, metrics=True)

    return app
