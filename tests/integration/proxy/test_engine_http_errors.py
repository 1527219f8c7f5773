"""The engine client over real HTTP (aiohttp): statuses, broken connections and long lines
become the same typed errors and results as through a plugged httpx transport."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web

from gyre_proxy.engines import (
    ContextLengthExceeded,
    EngineClient,
    EngineClientConfig,
    EngineNotAccepting,
    EngineProtocolError,
    EngineRequestAborted,
    EngineUnavailable,
    FinishKind,
    GyreProxyError,
    SamplingConfig,
)
from gyre_proxy.engines.refengine import free_port
from gyre_proxy.engines.wire import NOT_ACCEPTING_MESSAGE

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
CONTEXT = "The input (9 tokens) is longer than the model's context length (8 tokens)."


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[str]]]:
    runners: list[web.AppRunner] = []

    async def start(handler: Handler) -> str:
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
        return f"http://127.0.0.1:{port}"

    yield start
    for runner in runners:
        await runner.cleanup()


def answer(status: int, body: object) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        return web.json_response(body, status=status)

    return handle


def chunk(ids: list[int], total: int, finish: dict[str, object] | None) -> bytes:
    meta = {
        "id": "r",
        "completion_tokens": total,
        "finish_reason": finish,
        "output_token_logprobs": [[-0.5, token, None] for token in ids],
    }
    return b"data: " + json.dumps({"output_ids": ids, "meta_info": meta}).encode() + b"\n\n"


@pytest.mark.parametrize(
    ("status", "body", "error"),
    [
        (400, {"error": {"message": CONTEXT}}, ContextLengthExceeded),
        (503, {"error": {"message": NOT_ACCEPTING_MESSAGE}}, EngineNotAccepting),
        (503, {"object": "error", "message": "server is starting"}, EngineUnavailable),
        (500, {"detail": "scheduler aborted"}, EngineRequestAborted),
        (404, {"detail": "Not Found"}, EngineProtocolError),
        (200, {"unexpected": True}, EngineProtocolError),
    ],
)
async def test_statuses_are_typed(
    serve: Callable[[Handler], Awaitable[str]], status: int, body: object, error: type[GyreProxyError]
) -> None:
    async with EngineClient(EngineClientConfig(await serve(answer(status, body)))) as client:
        with pytest.raises(error) as raised:
            await client.generate([1, 2], SamplingConfig())
    assert type(raised.value) is error


async def test_a_rejected_stream_is_typed(serve: Callable[[Handler], Awaitable[str]]) -> None:
    url = await serve(answer(400, {"error": {"message": CONTEXT}}))
    async with EngineClient(EngineClientConfig(url)) as client:
        with pytest.raises(ContextLengthExceeded):
            async for _ in client.generate_stream([1, 2], SamplingConfig()):
                pass


async def test_no_engine_is_unavailable_with_cause() -> None:
    async with EngineClient(EngineClientConfig(f"http://127.0.0.1:{free_port()}")) as client:
        with pytest.raises(EngineUnavailable) as raised:
            await client.generate([1], SamplingConfig())
        with pytest.raises(EngineUnavailable):
            async for _ in client.generate_stream([1], SamplingConfig()):
                pass
        assert not await client.health()
    assert isinstance(raised.value.__cause__, aiohttp.ClientConnectionError)


async def test_a_silent_engine_times_out(serve: Callable[[Handler], Awaitable[str]]) -> None:
    async def slow(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(5)
        return web.json_response({})

    url = await serve(slow)
    async with EngineClient(EngineClientConfig(url, timeout_s=0.2)) as client:
        with pytest.raises(EngineUnavailable, match="timed out"):
            await client.model_info()


async def test_a_stream_cut_mid_answer_is_unavailable(serve: Callable[[Handler], Awaitable[str]]) -> None:
    async def cut(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(chunk([7], 1, None))
        await asyncio.sleep(0.05)
        assert request.transport is not None
        request.transport.close()  # the engine process dies
        return response

    async with EngineClient(EngineClientConfig(await serve(cut))) as client:
        got = []
        with pytest.raises(EngineUnavailable, match="broke"):
            async for delta in client.generate_stream([1], SamplingConfig()):
                got.append(delta.output_ids.tolist())
    assert got == [[7]]


async def test_a_cumulative_chunk_of_megabytes_arrives_whole(
    serve: Callable[[Handler], Awaitable[str]],
) -> None:
    # A cumulative SGLang chunk repeats every token so far: one SSE line of megabytes.
    ids = [i % 1000 for i in range(60_000)]

    async def long(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(chunk(ids[:10], 10, None))
        await response.write(chunk(ids, len(ids), {"type": "length", "length": len(ids)}))
        await response.write(b"data: [DONE]\n\n")
        return response

    async with EngineClient(EngineClientConfig(await serve(long))) as client:
        deltas = [d async for d in client.generate_stream([1], SamplingConfig(max_new_tokens=len(ids)))]
    assert [t for d in deltas for t in d.output_ids.tolist()] == ids
    assert deltas[-1].finish is not None and deltas[-1].finish.kind is FinishKind.LENGTH


def paced(count: int, gap_s: float, then_s: float) -> Handler:
    """A stream of ``count`` tokens ``gap_s`` apart, then ``then_s`` of silence before its end."""

    async def handle(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for n in range(1, count + 1):
            await response.write(chunk([n], n, None))
            await asyncio.sleep(gap_s)
        await asyncio.sleep(then_s)
        await response.write(chunk([], count, {"type": "stop"}))
        await response.write(b"data: [DONE]\n\n")
        return response

    return handle


async def test_a_stream_silent_past_the_timeout_mid_answer_is_unavailable(
    serve: Callable[[Handler], Awaitable[str]],
) -> None:
    url = await serve(paced(2, 0.01, 5.0))
    async with EngineClient(EngineClientConfig(url, timeout_s=0.3)) as client:
        got = []
        with pytest.raises(EngineUnavailable, match="broke") as raised:
            async for delta in client.generate_stream([1], SamplingConfig()):
                got.append(delta.output_ids.tolist())
    assert got == [[1], [2]]
    assert "Timeout on reading data" in str(raised.value)  # aiohttp's SocketTimeoutError


async def test_a_stream_longer_than_the_timeout_with_data_inside_it_completes(
    serve: Callable[[Handler], Awaitable[str]],
) -> None:
    # Each gap is under the timeout, the whole answer several times over it.
    url = await serve(paced(12, 0.1, 0.1))
    async with EngineClient(EngineClientConfig(url, timeout_s=0.35)) as client:
        deltas = [d async for d in client.generate_stream([1], SamplingConfig())]
    assert [t for d in deltas for t in d.output_ids.tolist()] == list(range(1, 13))
    assert deltas[-1].finish is not None and deltas[-1].finish.kind is FinishKind.STOP
