"""The harness-facing HTTP APIs: Anthropic Messages and OpenAI Chat Completions over one
``Answerer``, as a Starlette app, with their error shapes and server-sent events. The
adapters translate HTTP to ``ChatRequest`` and back; they never see tokens or engines.
"""

from __future__ import annotations

from gyre_proxy.api.adapter import DEFAULT_MAX_BODY_BYTES, ApiSettings
from gyre_proxy.api.anthropic import MESSAGES_DECODER, to_chat_request
from gyre_proxy.api.app import KEEP_ALIVE_S, build_app, proxy_server
from gyre_proxy.api.errors import as_api_error
from gyre_proxy.api.sse import STREAM_ERROR_KEY

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "KEEP_ALIVE_S",
    "MESSAGES_DECODER",
    "STREAM_ERROR_KEY",
    "ApiSettings",
    "as_api_error",
    "build_app",
    "proxy_server",
    "to_chat_request",
]
