"""Errors the harness-facing APIs answer with, and their Anthropic and OpenAI wire shapes.

The core (or an adapter) raises an ``ApiError``; the adapter turns it into the status and
body each API's official SDK maps to its own exception classes. Engine errors and any other
exception are translated by ``as_api_error``, which never puts internals into a message.
``read_body`` and ``authenticate`` are the two checks every request passes first. The tree::

    GyreProxyError
     └── ApiError                 500 api_error      / 500 server_error
          ├── InvalidRequest      400 invalid_request_error (both)
          │    └── ContextTooLong 400, OpenAI code context_length_exceeded
          ├── Unauthorized        401 authentication_error / invalid_api_key
          ├── NotFound            404 not_found_error
          ├── RequestTooLarge     413 request_too_large
          ├── RateLimited         429 rate_limit_error / rate_limit_exceeded
          └── Overloaded          529 overloaded_error / 503 server_error
"""

from __future__ import annotations

import logging
from typing import ClassVar

import msgspec
from starlette.datastructures import Headers
from starlette.requests import Request

from gyre_proxy.chat.answerer import ExecutionAuth, KeyResolver
from gyre_proxy.exceptions import (
    ContextLengthExceeded,
    EngineBadRequest,
    EngineError,
    EngineRequestAborted,
    EngineUnavailable,
    GyreProxyError,
)

log = logging.getLogger(__name__)


class ApiError(GyreProxyError):
    """The server failed to answer the request."""

    anthropic_status: ClassVar[int] = 500
    anthropic_type: ClassVar[str] = "api_error"
    openai_status: ClassVar[int] = 500
    openai_type: ClassVar[str] = "server_error"
    openai_code: ClassVar[str | None] = None

    def __init__(
        self, message: str | None = None, *, param: str | None = None, retry_after_s: float | None = None
    ) -> None:
        super().__init__(message)
        self.message = str(self)
        self.param = param
        self.retry_after_s = retry_after_s


class InvalidRequest(ApiError):
    """The request is malformed."""

    anthropic_status = 400
    anthropic_type = "invalid_request_error"
    openai_status = 400
    openai_type = "invalid_request_error"


class ContextTooLong(InvalidRequest):
    """prompt is too long for the model's context window"""

    openai_code = "context_length_exceeded"

    def __init__(
        self, message: str | None = None, *, input_tokens: int | None = None, limit: int | None = None
    ) -> None:
        # Claude Code starts its automatic compaction on a 400 whose message begins
        # "prompt is too long", so that prefix is kept whatever the numbers are.
        if message is None and input_tokens is not None and limit is not None:
            message = f"prompt is too long: {input_tokens} tokens > {limit} maximum"
        elif message is not None and not message.lower().startswith("prompt is too long"):
            message = f"prompt is too long: {message}"
        super().__init__(message, param="messages")


class Unauthorized(ApiError):
    """invalid x-api-key"""

    anthropic_status = 401
    anthropic_type = "authentication_error"
    openai_status = 401
    openai_type = "invalid_request_error"
    openai_code = "invalid_api_key"


class NotFound(ApiError):
    """Not found."""

    anthropic_status = 404
    anthropic_type = "not_found_error"
    openai_status = 404
    openai_type = "invalid_request_error"


class RequestTooLarge(ApiError):
    """Request exceeds the maximum allowed number of bytes."""

    anthropic_status = 413
    anthropic_type = "request_too_large"
    openai_status = 413
    openai_type = "invalid_request_error"
    openai_code = "request_too_large"


class RateLimited(ApiError):
    """Too many requests for this API key; retry later."""

    anthropic_status = 429
    anthropic_type = "rate_limit_error"
    openai_status = 429
    openai_type = "requests"
    openai_code = "rate_limit_exceeded"


class Overloaded(ApiError):
    """Overloaded"""

    anthropic_status = 529
    anthropic_type = "overloaded_error"
    openai_status = 503
    openai_type = "server_error"
    openai_code = "overloaded"


def as_api_error(exc: BaseException) -> ApiError:
    """The ``ApiError`` to answer for ``exc``; unknown exceptions become a bare 500."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ContextLengthExceeded):
        return ContextTooLong(str(exc))
    if isinstance(exc, EngineBadRequest):
        return InvalidRequest(f"the model engine rejected the request: {exc}")
    if isinstance(exc, EngineUnavailable | EngineRequestAborted):
        # Both are transient (an engine draining for a role transition, a restart):
        # an overloaded answer makes the harness retry.
        return Overloaded()
    if isinstance(exc, EngineError):
        return ApiError("the model engine failed while serving the request")
    log.error("unexpected error while serving a request", exc_info=exc)
    return ApiError("Internal server error")


# -- wire shapes -----------------------------------------------------------------------------


class AnthropicErrorDetail(msgspec.Struct, frozen=True):
    type: str
    message: str


class AnthropicErrorBody(msgspec.Struct, frozen=True, tag="error"):
    error: AnthropicErrorDetail


class OpenAIErrorDetail(msgspec.Struct, frozen=True):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIErrorBody(msgspec.Struct, frozen=True):
    error: OpenAIErrorDetail


def anthropic_error_body(err: ApiError) -> bytes:
    """``{"type": "error", "error": {"type": ..., "message": ...}}``."""
    return msgspec.json.encode(AnthropicErrorBody(AnthropicErrorDetail(err.anthropic_type, err.message)))


def openai_error_body(err: ApiError) -> bytes:
    """``{"error": {"message": ..., "type": ..., "param": ..., "code": ...}}``."""
    detail = OpenAIErrorDetail(err.message, err.openai_type, err.param, err.openai_code)
    return msgspec.json.encode(OpenAIErrorBody(detail))


def error_headers(err: ApiError) -> dict[str, str]:
    """``retry-after`` when the error says when to come back; both SDKs honour it."""
    if err.retry_after_s is None:
        return {}
    return {"retry-after": f"{max(0.0, err.retry_after_s):g}"}


# -- the checks every request passes --------------------------------------------------------


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
