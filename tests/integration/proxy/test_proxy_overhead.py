"""The proxy's overhead on every response, over real HTTP: the ``x-gyre-overhead-duration-ms``
header read through the official SDKs' raw responses on each API, streamed and not, and the
same figures in ``gyre_proxy_overhead_duration_seconds`` scraped from /metrics.

The engine is an SGLang-API stand-in that streams its answer one token per ``STEP_S``: the
proxy waits on it for at least the answer's tokens x ``STEP_S``, which the header must leave
out (the header plus that wait fits within the call's wall time).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anthropic
import msgspec
import openai
import pytest
from scraping import scrape, value
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from gyre_proxy.engines import qwen_tokenizer
from gyre_proxy.hosting import ServerThread
from gyre_proxy.service import OVERHEAD_HEADER, ProxyConfig, ProxyService, issue_key
from gyre_store import InMemoryEventLog

STEP_S = 0.05  # the stand-in engine's pace: one token per step
ANSWER = "Hello there, this is the answer."


def paced_engine() -> Starlette:
    """``/generate`` streaming ``ANSWER`` then ``<|im_end|>``, a token per ``STEP_S``."""
    tok = qwen_tokenizer()
    ids = [*tok.encode(ANSWER), tok.special("<|im_end|>")]

    async def generate(request: Request) -> StreamingResponse:
        body = msgspec.json.decode(await request.body())

        async def chunks() -> AsyncIterator[bytes]:
            for k, t in enumerate(ids):
                await asyncio.sleep(STEP_S)
                meta: dict[str, Any] = {
                    "id": body["rid"],
                    "prompt_tokens": len(body["input_ids"]),
                    "completion_tokens": k + 1,
                    "output_token_logprobs": [[-0.1, t, None]],
                    "weight_version": "0",
                }
                if k == len(ids) - 1:
                    meta["finish_reason"] = {"type": "stop", "matched": t}
                yield b"data: " + msgspec.json.encode({"output_ids": [t], "meta_info": meta}) + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    async def ok(request: Request) -> JSONResponse:
        return JSONResponse({"model_path": "paced", "weight_version": "0"})

    return Starlette(
        routes=[
            Route("/generate", generate, methods=["POST"]),
            Route("/abort_request", ok, methods=["POST"]),
            Route("/health", ok),
        ]
    )


ENGINE_WAIT_S = (len(qwen_tokenizer().encode(ANSWER)) + 1) * STEP_S  # at least this long per answer


@pytest.fixture
def proxy() -> Iterator[ProxyService]:
    with (
        ServerThread(paced_engine(), name="the paced engine") as engine,
        ProxyService(InMemoryEventLog(), ProxyConfig(engines=[("e0", engine.base_url)])) as service,
    ):
        yield service


def overhead_ms(headers: Any) -> float:
    return float(headers[OVERHEAD_HEADER])


def test_every_api_reports_its_overhead_in_a_header_and_the_histogram(proxy: ProxyService) -> None:
    base = proxy.base_url
    key = issue_key(proxy.log, execution_id="ex1", run_id="run1", harness="claude-code")
    claude = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
    gpt = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
    user = [{"role": "user", "content": "Say hello."}]
    seen: dict[tuple[str, str], list[float]] = {}

    def note(api: str, stream: bool, headers: Any, began: float, engine_s: float = ENGINE_WAIT_S) -> None:
        wall_ms = (time.perf_counter() - began) * 1e3
        ms = overhead_ms(headers)
        assert ms >= 0
        # A response sent whole leaves the answer's engine wait out; a streamed one sends its
        # header before the engine is asked, and the answer takes the engine's pace after it.
        assert ms + engine_s * 1e3 <= wall_ms, (api, stream, ms, wall_ms)
        seen.setdefault((api, "true" if stream else "false"), []).append(ms)

    began = time.perf_counter()
    raw = claude.messages.with_raw_response.create(model="gyre", max_tokens=64, messages=user)  # type: ignore[arg-type]
    assert raw.parse().content[0].text == ANSWER  # type: ignore[union-attr]
    note("anthropic_messages", False, raw.headers, began)

    began = time.perf_counter()
    with claude.messages.stream(model="gyre", max_tokens=64, messages=user) as stream:  # type: ignore[arg-type]
        headers = stream.response.headers
        assert stream.get_final_text() == ANSWER
    note("anthropic_messages", True, headers, began)

    gpt_key = issue_key(proxy.log, execution_id="ex2", run_id="run1", harness="claude-code")
    gpt = openai.OpenAI(base_url=f"{base}/v1", api_key=gpt_key, max_retries=0)
    began = time.perf_counter()
    chat = gpt.chat.completions.with_raw_response.create(model="gyre", max_tokens=64, messages=user)  # type: ignore[arg-type]
    assert chat.parse().choices[0].message.content == ANSWER
    note("openai_chat", False, chat.headers, began)

    began = time.perf_counter()
    with gpt.chat.completions.with_streaming_response.create(
        model="gyre",
        max_tokens=64,
        messages=user,  # type: ignore[arg-type]
        stream=True,
    ) as response:
        text = "".join(c.choices[0].delta.content or "" for c in response.parse() if c.choices)
        note("openai_chat", True, response.headers, began)
    assert text == ANSWER

    resp_key = issue_key(proxy.log, execution_id="ex3", run_id="run1", harness="claude-code")
    gpt = openai.OpenAI(base_url=f"{base}/v1", api_key=resp_key, max_retries=0)
    began = time.perf_counter()
    answer = gpt.responses.with_raw_response.create(model="gyre", input="Say hello.", store=False)
    assert answer.parse().output_text == ANSWER
    note("openai_responses", False, answer.headers, began)

    began = time.perf_counter()
    with gpt.responses.with_streaming_response.create(
        model="gyre", input="Say hello.", store=False, stream=True
    ) as response:
        kinds = [event.type for event in response.parse()]
        note("openai_responses", True, response.headers, began)
    assert kinds[-1] == "response.completed"

    # An error answered before any engine is asked carries it too.
    refused = anthropic.Anthropic(base_url=base, api_key="not-a-key", max_retries=0)
    began = time.perf_counter()
    with pytest.raises(anthropic.AuthenticationError) as caught:
        refused.messages.create(model="gyre", max_tokens=8, messages=user)  # type: ignore[arg-type]
    note("anthropic_messages", False, caught.value.response.headers, began, engine_s=0.0)

    samples = scrape(base)
    for (api, stream), values in seen.items():
        labels = {"api": api, "stream": stream}
        assert value(samples, "gyre_proxy_overhead_duration_seconds_count", **labels) == len(values)
        # The header is rounded to a microsecond; the histogram holds the same figures unrounded.
        total = value(samples, "gyre_proxy_overhead_duration_seconds_sum", **labels)
        assert total * 1e3 == pytest.approx(sum(values), abs=1e-3 * len(values))
