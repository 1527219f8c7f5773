"""Request bodies of the three harness-facing APIs turned into the ``ChatRequest`` the proxy answers.

Shared by the proxy's unit tests that state one conversation in each API's words.
"""

from __future__ import annotations

from typing import Any

import msgspec

from gyre_proxy.api import anthropic, openai_chat, openai_responses
from gyre_proxy.chat import ChatRequest

APIS = ("anthropic", "openai-chat", "openai-responses")


def translate(api: str, body: dict[str, Any]) -> ChatRequest:
    """``body`` (without ``model`` and ``max_tokens``, added here) as the ``api`` adapter reads it."""
    raw = msgspec.json.encode({"model": "m", "max_tokens": 100, **body})
    if api == "anthropic":
        return anthropic.to_chat_request(anthropic.MESSAGES_DECODER.decode(raw))
    if api == "openai-chat":
        return openai_chat.to_chat_request(openai_chat.COMPLETIONS_DECODER.decode(raw))
    if api == "openai-responses":
        return openai_responses.to_chat_request(openai_responses.RESPONSES_DECODER.decode(raw))[0]
    raise ValueError(f"unknown API {api!r}; one of {APIS}")
