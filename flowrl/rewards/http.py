"""The remote reward's HTTP calls: a timeout on every attempt, retries with exponential backoff, and one error
type for "the server did not answer" (which the trainer checkpoints on) and one for "it answered wrongly".

Only failures that a later attempt can cure are retried: a refused or dropped connection, a timeout, and the
statuses 408 (request timeout), 429 (too many requests) and 5xx. A 4xx is the request's fault and an answer
that is not the protocol's is the server's; neither changes on a retry, so both fail at once (a deterministic
server bug must not become a near-endless retry loop). Standard library only: the training venv needs no
HTTP package.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from typing import Any

from flowrl.core.interfaces import RewardError
from flowrl.rewards.wire import WireError, loads

RETRIED_STATUS = frozenset({408, 429, *range(500, 600)})
MAX_BACKOFF_S = 30.0


class RemoteRewardError(RewardError):
    """The reward server answered, but not with a usable answer (a 4xx, a malformed body, the wrong count)."""


class RewardServerUnavailable(RemoteRewardError):
    """The reward server did not answer after every retry (down, unreachable, too slow, or failing with 5xx);
    the trainer writes a checkpoint of the iteration's start before it stops (flowrl.trainer.checkpoints.restart)."""


def _server_message(error: urllib.error.HTTPError) -> str:
    try:
        body = error.read(4096).decode("utf-8", "replace")
    except Exception:  # a body that breaks off is no worse than none
        return ""
    try:
        found = json.loads(body)
        message = found.get("error") or found.get("detail") or found.get("message") if isinstance(found, dict) else ""
        return str(message or body)[:300]
    except json.JSONDecodeError:
        return body.strip()[:300]


def read_until(response: Any, deadline: float) -> bytes:
    """The response body, read in pieces until ``deadline`` (``time.monotonic()``): a socket timeout bounds
    each read only, so a server that sends a byte at a time would otherwise hold an attempt indefinitely."""
    pieces: list[bytes] = []
    while True:
        piece = response.read1(65536)
        if not piece:
            return b"".join(pieces)
        pieces.append(piece)
        if time.monotonic() > deadline:
            raise TimeoutError("the answer did not arrive in time")


class Endpoint:
    """One server address, with the retry policy of a ``[[reward]] type = "remote"`` table."""

    def __init__(self, url: str, timeout_s: float, retries: int, backoff_s: float, token: str = "") -> None:
        self.url, self.timeout_s, self.retries, self.backoff_s = url.rstrip("/"), timeout_s, retries, backoff_s
        self.token = token
        self.attempts = 0  # HTTP attempts made (for tests and logs)

    def headers(self, json_body: bool) -> dict[str, str]:
        out = {"Accept": "application/json"}
        if json_body:
            out["Content-Type"] = "application/json"
        if self.token:
            out["Authorization"] = f"Bearer {self.token}"
        return out

    def get(self, path: str, retries: int | None = None) -> Any:
        return self.call("GET", path, None, self.retries if retries is None else retries)

    def post(self, path: str, body: dict[str, Any], limit: int | None = None) -> Any:
        """POST ``body`` as JSON; a body over the server's ``limit`` (bytes) is refused here, before it is sent."""
        data = json.dumps(body, allow_nan=False).encode("utf-8")
        if limit is not None and len(data) > limit:
            raise RemoteRewardError(f"a request to reward server {self.url}{path} of {len(data)} bytes is over the "
                                    f"server's limit of {limit} bytes (max_body_bytes at /health); lower "
                                    "reward.batch_size or raise the server's --max-body-mb")
        return self.call("POST", path, data, self.retries)

    def call(self, method: str, path: str, data: bytes | None, retries: int) -> Any:
        """The decoded JSON answer; :class:`RewardServerUnavailable` once ``retries`` retries failed too,
        :class:`RemoteRewardError` at once for an answer no retry can mend."""
        address = f"{self.url}{path}"
        last = ""
        for attempt in range(retries + 1):
            if attempt:
                time.sleep(min(self.backoff_s * 2 ** (attempt - 1), MAX_BACKOFF_S))
            self.attempts += 1
            request = urllib.request.Request(address, data=data, method=method, headers=self.headers(data is not None))
            try:
                deadline = time.monotonic() + self.timeout_s
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    text = read_until(response, deadline)
            except urllib.error.HTTPError as error:
                message = _server_message(error)
                if error.code not in RETRIED_STATUS:
                    hint = " (set the token's environment variable, reward.token_env)" if error.code == 401 else ""
                    raise RemoteRewardError(f"reward server {address} refused the request: HTTP {error.code}"
                                            f"{': ' + message if message else ''}{hint}") from None
                last = f"HTTP {error.code}{': ' + message if message else ''}"
                continue
            except TimeoutError:
                last = f"no answer within timeout_s = {self.timeout_s:g}"
                continue
            except (urllib.error.URLError, http.client.HTTPException, ConnectionError, OSError) as error:
                reason = getattr(error, "reason", error)
                if isinstance(reason, TimeoutError):
                    last = f"no answer within timeout_s = {self.timeout_s:g}"
                else:
                    last = f"{type(reason).__name__}: {reason}" if str(reason) else type(reason).__name__
                continue
            try:
                return loads(text)
            except WireError as error:
                raise RemoteRewardError(f"reward server {address} sent a malformed answer: {error}") from None
        tries = f"{retries + 1} attempt{'s' if retries else ''}"
        raise RewardServerUnavailable(f"reward server {address} did not answer ({last}; {tries})")
