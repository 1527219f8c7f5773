"""Errors as the harness-facing APIs answer them: an ``ApiError`` in Anthropic's or OpenAI's
wire shape, and the translation of any other exception into one.

The ``ApiError`` classes live in ``gyre_proxy.exceptions`` (the package's one tree); each
carries its status and error type for both APIs, and the bodies written here are what each
API's official SDK maps to its own exception classes. ``as_api_error`` translates engine
errors and anything unexpected, and never puts internals into a message.
"""

from __future__ import annotations

import logging

import msgspec
from starlette.responses import Response

from gyre_proxy.api.adapter import JSON
from gyre_proxy.exceptions import (
    ApiError,
    ContextLengthExceeded,
    ContextTooLong,
    EngineBadRequest,
    EngineError,
    EngineRequestAborted,
    EngineUnavailable,
    InvalidRequest,
    Overloaded,
)

log = logging.getLogger(__name__)


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


def anthropic_error_response(exc: BaseException, *, status: int | None = None) -> Response:
    """The Anthropic answer for ``exc``; ``status`` overrides the error's own (routing errors)."""
    err = as_api_error(exc)
    return _response(anthropic_error_body(err), status or err.anthropic_status, err)


def openai_error_response(exc: BaseException, *, status: int | None = None) -> Response:
    """The OpenAI answer for ``exc``; ``status`` overrides the error's own (routing errors)."""
    err = as_api_error(exc)
    return _response(openai_error_body(err), status or err.openai_status, err)


def _response(body: bytes, status: int, err: ApiError) -> Response:
    return Response(body, status_code=status, headers=error_headers(err), media_type=JSON)
