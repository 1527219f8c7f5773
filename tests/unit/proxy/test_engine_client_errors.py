"""HTTP statuses and transport failures become typed errors at the client."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest

from gyre_proxy.engines import (
    ContextLengthExceeded,
    EngineBadRequest,
    EngineClient,
    EngineClientConfig,
    EngineNotAccepting,
    EngineProtocolError,
    EngineRequestAborted,
    EngineServerError,
    EngineUnavailable,
    GyreProxyError,
    SamplingConfig,
    WeightUpdateFailed,
)
from gyre_proxy.engines.wire import NOT_ACCEPTING_MESSAGE

pytestmark = pytest.mark.anyio

Handler = Callable[[httpx.Request], httpx.Response]


def client_for(handler: Handler) -> EngineClient:
    return EngineClient(EngineClientConfig("http://engine"), transport=httpx.MockTransport(handler))


def answer(status: int, body: object) -> Handler:
    return lambda request: httpx.Response(status, json=body)


@pytest.mark.parametrize(
    ("status", "body", "error"),
    [
        (
            400,
            {
                "error": {
                    "message": "The input (9 tokens) is longer than the model's context length (8 tokens)."
                }
            },
            ContextLengthExceeded,
        ),
        (400, {"error": {"message": "Duplicate request ID"}}, EngineBadRequest),
        (503, {"error": {"message": NOT_ACCEPTING_MESSAGE}}, EngineNotAccepting),
        (503, {"object": "error", "message": "server is starting"}, EngineUnavailable),
        (500, {"detail": "scheduler aborted"}, EngineRequestAborted),
        (422, {"detail": "bad"}, EngineBadRequest),
        (404, {"detail": "Not Found"}, EngineProtocolError),
        (200, {"unexpected": True}, EngineProtocolError),
    ],
)
async def test_generate_statuses(status: int, body: object, error: type[GyreProxyError]) -> None:
    async with client_for(answer(status, body)) as client:
        with pytest.raises(error) as raised:
            await client.generate([1, 2], SamplingConfig())
    assert type(raised.value) is error


async def test_connection_failure_is_unavailable_with_cause() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    async with client_for(refuse) as client:
        with pytest.raises(EngineUnavailable) as raised:
            await client.generate([1], SamplingConfig())
        assert not await client.health()
    assert isinstance(raised.value.__cause__, httpx.ConnectError)


async def test_timeout_is_unavailable() -> None:
    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    async with client_for(slow) as client:
        with pytest.raises(EngineUnavailable, match="timed out"):
            await client.model_info()


async def test_stream_without_finish_is_aborted() -> None:
    partial = {
        "output_ids": [7],
        "meta_info": {"id": "r", "completion_tokens": 1, "output_token_logprobs": [[-1.0, 7, None]]},
    }
    body = f"data: {json.dumps(partial)}\n\ndata: [DONE]\n\n"

    def stream(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})

    async with client_for(stream) as client:
        got = []
        with pytest.raises(EngineRequestAborted):
            async for delta in client.generate_stream([1], SamplingConfig()):
                got.append(delta.output_ids.tolist())
    assert got == [[7]]


async def test_request_body_asks_for_output_logprobs() -> None:
    seen: list[dict[str, object]] = []

    def capture(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(
            200,
            json={
                "output_ids": [3],
                "meta_info": {
                    "id": "x",
                    "finish_reason": {"type": "length", "length": 1},
                    "completion_tokens": 1,
                    "weight_version": "w",
                    "output_token_logprobs": [[-0.25, 3, None]],
                },
            },
        )

    async with client_for(capture) as client:
        result = await client.generate([1, 2, 3], SamplingConfig(max_new_tokens=1), rid="x")
    assert seen[0]["return_logprob"] is True and seen[0]["logprob_start_len"] == 2 and seen[0]["rid"] == "x"
    assert result.logprobs.dtype.name == "float32" and result.output_ids.dtype.name == "int32"
    assert result.logprobs.tolist() == [-0.25] and result.weight_version == "w"


async def test_model_info_falls_back_to_the_old_path() -> None:
    def route(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/get_model_info":
            return httpx.Response(200, json={"model_path": "m", "is_generation": True, "weight_version": "3"})
        return httpx.Response(404, json={"detail": "Not Found"})

    async with client_for(route) as client:
        info = await client.model_info()
    assert (info.model_path, info.weight_version) == ("m", "3")


@pytest.mark.parametrize("status", [200, 400])
async def test_weight_update_failure_is_typed(status: int) -> None:
    async with client_for(answer(status, {"success": False, "message": "no such file"})) as client:
        with pytest.raises(WeightUpdateFailed, match="no such file"):
            await client.update_weights_from_disk("/nowhere", weight_version="2")


async def test_server_error_outside_generate_is_server_error() -> None:
    async with client_for(answer(502, {"detail": "bad gateway"})) as client:
        with pytest.raises(EngineServerError):
            await client.flush_cache()


async def test_a_stream_ending_without_done_or_a_last_newline_still_counts_its_last_chunk() -> None:
    def chunk(ids: list[int], total: int, finish: dict[str, object] | None) -> str:
        meta = {
            "id": "r",
            "completion_tokens": total,
            "finish_reason": finish,
            "output_token_logprobs": [[-1.0, i, None] for i in ids],
        }
        return "data: " + json.dumps({"output_ids": ids, "meta_info": meta})

    # No [DONE], and the body's last line (the one with the finish) has no newline.
    body = chunk([7], 1, None) + "\n\n" + chunk([8], 2, {"type": "stop"})

    def stream(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})

    async with client_for(stream) as client:
        deltas = [delta async for delta in client.generate_stream([1], SamplingConfig())]
    assert [d.output_ids.tolist() for d in deltas] == [[7], [8]]
    assert deltas[-1].finish is not None
