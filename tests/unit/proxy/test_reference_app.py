"""The reference engine's HTTP app, in process through httpx's ASGI transport."""

from __future__ import annotations

import itertools
import json

import httpx
import pytest

from gyre_proxy.engines import (
    ContextLengthExceeded,
    EngineBadRequest,
    EngineClient,
    EngineClientConfig,
    EngineNotAccepting,
    FinishKind,
    SamplingConfig,
)
from gyre_proxy.engines.refengine import ReferenceEngine, ReferenceEngineConfig, build_app

pytestmark = pytest.mark.anyio


async def test_generate_reports_sglang_fields(engine: ReferenceEngine) -> None:
    transport = httpx.ASGITransport(app=build_app(engine))
    async with httpx.AsyncClient(transport=transport, base_url="http://engine") as http:
        response = await http.post(
            "/generate",
            json={
                "input_ids": [1, 2, 3],
                "sampling_params": {"max_new_tokens": 3, "temperature": 0},
                "return_logprob": True,
                "rid": "a",
            },
        )
    body = response.json()
    assert response.status_code == 200
    meta = body["meta_info"]
    assert (
        meta["id"] == "a"
        and meta["prompt_tokens"] == 3
        and meta["completion_tokens"] == len(body["output_ids"])
    )
    assert meta["weight_version"] == "default"
    assert [entry[1] for entry in meta["output_token_logprobs"]] == body["output_ids"]
    assert all(entry[2] is None for entry in meta["output_token_logprobs"])
    assert meta["finish_reason"]["type"] in ("stop", "length")


async def test_cumulative_stream_chunks(engine: ReferenceEngine) -> None:
    transport = httpx.ASGITransport(app=build_app(engine))
    async with httpx.AsyncClient(transport=transport, base_url="http://engine") as http:
        response = await http.post(
            "/generate",
            json={
                "input_ids": [4, 5],
                "sampling_params": {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True},
                "stream": True,
                "return_logprob": True,
            },
        )
    lines = [line for line in response.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    ids = [chunk["output_ids"] for chunk in chunks]
    assert all(later[: len(earlier)] == earlier for earlier, later in itertools.pairwise(ids))
    assert len(ids[-1]) == 5 and chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"


async def test_incremental_streaming_gives_the_same_tokens() -> None:
    config = ReferenceEngineConfig(max_context=64, incremental_streaming_output=True)
    with ReferenceEngine(config) as incremental:
        transport = httpx.ASGITransport(app=build_app(incremental))
        async with EngineClient(EngineClientConfig("http://e"), transport=transport) as client:
            sampling = SamplingConfig(max_new_tokens=6, temperature=0.0, ignore_eos=True)
            whole = await client.generate([9, 8, 7], sampling)
            streamed = [
                int(t) async for d in client.generate_stream([9, 8, 7], sampling) for t in d.output_ids
            ]
    assert streamed == whole.output_ids.tolist()


async def test_rejections(asgi_client: EngineClient, engine: ReferenceEngine) -> None:
    with pytest.raises(ContextLengthExceeded, match="longer than the model's context length"):
        await asgi_client.generate([1] * engine.context_length, SamplingConfig(max_new_tokens=1))
    with pytest.raises(ContextLengthExceeded, match="maximum context length"):
        await asgi_client.generate([1] * 10, SamplingConfig(max_new_tokens=engine.context_length))
    with pytest.raises(EngineBadRequest, match="vocabulary"):
        await asgi_client.generate([10_000], SamplingConfig(max_new_tokens=1))
    with pytest.raises(EngineBadRequest, match="empty"):
        await asgi_client.generate([], SamplingConfig(max_new_tokens=1))


async def test_stop_and_resume_accepting(asgi_client: EngineClient) -> None:
    status = await asgi_client.stop_accepting()
    try:
        assert not status.accepting
        with pytest.raises(EngineNotAccepting):
            await asgi_client.generate([1, 2], SamplingConfig(max_new_tokens=1))
    finally:
        assert (await asgi_client.resume_accepting()).accepting
    assert len((await asgi_client.generate([1, 2], SamplingConfig(max_new_tokens=1))).output_ids) == 1


async def test_seeded_sampling_is_reproducible_and_versions_update(asgi_client: EngineClient) -> None:
    sampling = SamplingConfig(max_new_tokens=12, temperature=1.0, seed=42, ignore_eos=True)
    first = await asgi_client.generate([3, 4, 5], sampling)
    second = await asgi_client.generate([3, 4, 5], sampling)
    assert first.output_ids.tolist() == second.output_ids.tolist()
    await asgi_client.update_weight_version("v7")
    try:
        assert await asgi_client.weight_version() == "v7"
        assert (await asgi_client.generate([3], SamplingConfig(max_new_tokens=1))).weight_version == "v7"
    finally:
        await asgi_client.update_weight_version("default")


async def test_max_new_tokens_zero_and_stop_tokens(asgi_client: EngineClient) -> None:
    empty = await asgi_client.generate([3, 4], SamplingConfig(max_new_tokens=0))
    assert empty.output_ids.tolist() == [] and empty.finish.kind is FinishKind.LENGTH
    greedy = await asgi_client.generate(
        [3, 4], SamplingConfig(max_new_tokens=5, temperature=0.0, ignore_eos=True)
    )
    stop_at = int(greedy.output_ids[1])
    stopped = await asgi_client.generate(
        [3, 4], SamplingConfig(max_new_tokens=5, temperature=0.0, ignore_eos=True, stop_token_ids=(stop_at,))
    )
    assert stopped.finish.kind is FinishKind.STOP and stopped.finish.matched == stop_at
    assert (
        stopped.output_ids.tolist()
        == greedy.output_ids.tolist()[: greedy.output_ids.tolist().index(stop_at) + 1]
    )


async def test_flush_cache_and_health(asgi_client: EngineClient) -> None:
    await asgi_client.flush_cache()
    assert await asgi_client.health()
