"""The per-worker bound on model calls in flight: past it, each API's own overload answer, which
the official SDKs read as such (Anthropic 529 overloaded_error, OpenAI 429), with retry-after.
The SDKs speak through httpx2 (their own fork of httpx), so they get a transport of its kind."""

from __future__ import annotations

from typing import Any

import anthropic
import anyio
import httpx
import httpx2
import openai
import pytest

from gyre_proxy.service import InFlightLimit


class Held:
    """An app whose model calls wait until released; anything else answers at once."""

    def __init__(self) -> None:
        self.release = anyio.Event()
        self.entered = 0
        self.fail = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["path"] != "/health":
            self.entered += 1
            await self.release.wait()
            if self.fail:
                raise RuntimeError("the app failed")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_a_call_past_the_bound_is_refused_in_each_apis_shape() -> None:
    held = Held()
    limit = InFlightLimit(held, 1, retry_after_s=2.5)
    transport = httpx.ASGITransport(app=limit)
    async with (
        httpx.AsyncClient(transport=transport, base_url="http://proxy") as http,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(http.post, "/v1/chat/completions")
        while held.entered < 1:
            await anyio.sleep(0.01)
        assert limit.in_flight == 1
        sdk_http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=limit))

        claude = anthropic.AsyncAnthropic(
            api_key="k", base_url="http://proxy", http_client=sdk_http, max_retries=0
        )
        with pytest.raises(anthropic.OverloadedError) as refused:
            await claude.messages.create(
                model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
            )
        assert refused.value.status_code == 529
        assert refused.value.response.headers["retry-after"] == "2.5"
        assert refused.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]

        gpt = openai.AsyncOpenAI(api_key="k", base_url="http://proxy/v1", http_client=sdk_http, max_retries=0)
        with pytest.raises(openai.RateLimitError) as limited:
            await gpt.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert limited.value.status_code == 429
        assert limited.value.code == "rate_limit_exceeded"
        assert limited.value.response.headers["retry-after"] == "2.5"
        with pytest.raises(openai.RateLimitError):
            await gpt.responses.create(model="m", input="hi")

        assert (await http.get("/health")).status_code == 200  # not a model call: never bounded
        assert limit.refused == 3
        await sdk_http.aclose()
        held.release.set()
    assert limit.in_flight == 0
    async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as http:
        assert (await http.post("/v1/messages")).status_code == 200  # room again
        held.fail = True
        with pytest.raises(RuntimeError):
            await http.post("/v1/responses")
    assert limit.in_flight == 0  # a call that failed gave its place back


def test_the_bound_and_the_wait_are_checked() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        InFlightLimit(Held(), 0)
    with pytest.raises(ValueError, match="negative"):
        InFlightLimit(Held(), 1, retry_after_s=-1)
