"""A bounded number of model calls in flight per proxy worker; past it, a refusal in the API's shape.

Without a bound, a worker past its CPU takes every call it is sent and all of them slow down
together, until harnesses time out mid-answer. With one, the call over the bound is refused
before its body is read (nothing is tokenized, sent to an engine or recorded, so no record
can be lost) with the answer each API's clients already retry after the ``retry-after``
header: Anthropic's 529 ``overloaded_error``, OpenAI's 429 ``rate_limit_exceeded``. Calls
that reach the engines and the store are never cut short by the bound.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gyre_proxy.api.errors import anthropic_error_body, error_headers, openai_error_body
from gyre_proxy.exceptions import AtCapacity

# The model-call paths, by the API whose error shape answers them.
MODEL_CALLS: Mapping[str, str] = {
    "/v1/messages": "anthropic",
    "/v1/chat/completions": "openai",
    "/v1/responses": "openai",
}


class InFlightLimit:
    """``app`` (ASGI) taking at most ``limit`` model calls at once; the rest are refused.

    A call counts from its arrival until its response (a stream included) has been sent.
    ``retry_after_s`` is what the refusal's ``retry-after`` header asks for.
    """

    def __init__(self, app: Any, limit: int, *, retry_after_s: float = 1.0) -> None:
        if limit < 1:
            raise ValueError(f"the in-flight limit must be at least 1, got {limit}")
        if retry_after_s < 0:
            raise ValueError(f"retry-after must not be negative, got {retry_after_s}")
        self.app = app
        self.limit = limit
        self.retry_after_s = retry_after_s
        self.in_flight = 0
        self.refused = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        api = MODEL_CALLS.get(scope["path"]) if scope["type"] == "http" else None
        if api is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.limit:
            self.refused += 1
            await self._refuse(api, send)
            return
        # One event loop per worker: the count needs no lock.
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1

    async def _refuse(self, api: str, send: Any) -> None:
        err = AtCapacity(
            f"this proxy worker has {self.limit} model calls in flight, its limit; "
            f"retry after {self.retry_after_s:g} s",
            retry_after_s=self.retry_after_s,
        )
        body = anthropic_error_body(err) if api == "anthropic" else openai_error_body(err)
        status = err.anthropic_status if api == "anthropic" else err.openai_status
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", b"%d" % len(body)),
            *((k.encode(), v.encode()) for k, v in error_headers(err).items()),
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
