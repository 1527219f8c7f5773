"""What both API adapters share before their own code runs: their settings, and the checks
every request passes first (its API key, its body's size, its JSON against the API's schema).

Each adapter owns its request schema and its translation into a ``ChatRequest``; nothing
here knows either API's fields. ``app`` builds the settings and hands them to both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import msgspec
from starlette.datastructures import Headers
from starlette.requests import Request

from gyre_proxy.chat import ExecutionAuth, KeyResolver
from gyre_proxy.exceptions import InvalidRequest, RequestTooLarge, Unauthorized

T = TypeVar("T")

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
JSON = "application/json"


@dataclass(frozen=True)
class ApiSettings:
    """What both adapters need beyond the answerer.

    ``stream_start_timeout_s`` is how long a streaming request waits for the answerer's
    first event before sending its status line: a refusal within it is an HTTP error, a
    later one an SSE error event. ``ping_interval_s`` paces keep-alive pings while the
    answerer is quiet.
    """

    model_name: str
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    ping_interval_s: float = 10.0
    stream_start_timeout_s: float = 5.0


async def read_body(request: Request, limit_bytes: int) -> bytes:
    """The request body, or ``RequestTooLarge`` as soon as it passes ``limit_bytes``."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit_bytes:
        raise RequestTooLarge(f"request body is {declared} bytes; the limit is {limit_bytes} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit_bytes:
            raise RequestTooLarge(f"request body exceeds the limit of {limit_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def decode_body(raw: bytes, decoder: msgspec.json.Decoder[T]) -> T:
    """``raw`` decoded by an adapter's typed ``decoder``, or ``InvalidRequest`` naming the
    offending field (or saying the body is not JSON)."""
    try:
        return decoder.decode(raw)
    except msgspec.ValidationError as exc:
        raise InvalidRequest(f"invalid request: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc}") from exc


async def read_json(request: Request, decoder: msgspec.json.Decoder[T], settings: ApiSettings) -> T:
    """The body read (within ``settings.max_body_bytes``) and decoded by ``decoder``.

    The raw bytes stay on ``request.state.raw_body`` for whatever wants the request as sent.
    """
    raw = await read_body(request, settings.max_body_bytes)
    request.state.raw_body = raw
    return decode_body(raw, decoder)


def api_key_of(headers: Headers) -> str | None:
    """The key from ``x-api-key`` (Anthropic) or ``Authorization: Bearer`` (both APIs)."""
    key = headers.get("x-api-key")
    if key:
        return key.strip()
    scheme, _, token = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return None


async def authenticate(request: Request, keys: KeyResolver) -> ExecutionAuth:
    """The execution the request's API key belongs to; ``Unauthorized`` if none."""
    key = api_key_of(request.headers)
    if key is None:
        raise Unauthorized("missing API key: send it in x-api-key or Authorization: Bearer")
    execution = await keys.resolve(key)
    if execution is None:
        raise Unauthorized("invalid API key")
    return execution
