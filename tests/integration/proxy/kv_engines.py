"""Reference engines and requests shared by the KV-cache migration tests (over HTTP and over
Mooncake): the engines' configurations, a long stream to pin mid-decode, and the raw greedy
``/generate`` whose ``cached_tokens`` shows how much of a context an engine reused."""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass

import httpx
import numpy as np

from gyre_proxy.engines import EngineClient, FinishKind, SamplingConfig
from gyre_proxy.engines.refengine import DEFAULT_MODEL_CONFIG, ModelSource, ReferenceEngineConfig
from gyre_proxy.engines.refengine import ReferenceEngineServer as Server

CONTEXT = 1024
LONG = SamplingConfig(max_new_tokens=800, temperature=0.0, ignore_eos=True)
GREEDY = SamplingConfig(max_new_tokens=24, temperature=0.0, ignore_eos=True)
# Engines of one seed have the same weights; the other model has three layers.
SAME = ReferenceEngineConfig(max_context=CONTEXT, seed=0)
OTHER = dataclasses.replace(SAME, source=ModelSource(config={**DEFAULT_MODEL_CONFIG, "num_hidden_layers": 3}))


@dataclass
class Streaming:
    """A request streaming on an engine: what it has produced so far, and its end."""

    rid: str
    tokens: list[int]
    task: asyncio.Task[FinishKind | None]
    message: list[str | None]


async def start_streaming(client: EngineClient, rid: str, prompt: list[int], at_least: int = 8) -> Streaming:
    """Stream ``prompt`` greedily (``LONG``) on ``client``'s engine until it has produced
    ``at_least`` tokens; the stream goes on in the background."""
    tokens: list[int] = []
    message: list[str | None] = []

    async def consume() -> FinishKind | None:
        async for delta in client.generate_stream(prompt, LONG, rid=rid):
            tokens.extend(delta.output_ids.tolist())
            if delta.finish is not None:
                message.append(delta.finish.message)
                return delta.finish.kind
        return None

    task = asyncio.create_task(consume())
    while len(tokens) < at_least:
        assert not task.done(), "the stream ended before it was pinned"
        await asyncio.sleep(0.005)
    return Streaming(rid, tokens, task, message)


async def raw_generate(server: Server, ids: list[int]) -> tuple[list[int], list[float], int]:
    """Output ids, their logprobs and ``meta_info.cached_tokens`` of a greedy /generate."""
    body = {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": GREEDY.max_new_tokens, "temperature": 0, "ignore_eos": True},
        "return_logprob": True,
    }
    async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as http:
        response = await http.post("/generate", json=body)
    assert response.status_code == 200, response.text
    meta = response.json()["meta_info"]
    return response.json()["output_ids"], [e[0] for e in meta["output_token_logprobs"]], meta["cached_tokens"]


async def continues_like_a_full_prefill(
    destination: Server, reference: Server, covered: list[int]
) -> tuple[list[int], list[float]]:
    """The retry on ``destination`` (all the pinned ids) reuses all but the last position and
    gives the greedy tokens and logprobs of ``reference``'s full prefill, which are returned; a
    longer one reuses all."""
    ids, logprobs, cached = await raw_generate(destination, covered)
    full_ids, full_logprobs, full_cached = await raw_generate(reference, covered)
    assert (cached, full_cached) == (len(covered) - 1, 0)
    assert ids == full_ids
    np.testing.assert_allclose(logprobs, full_logprobs, atol=1e-4, rtol=0)
    longer = [*covered, 17, 18, 19]
    ids, logprobs, cached = await raw_generate(destination, longer)
    fresh_ids, fresh_logprobs, _ = await raw_generate(reference, longer)
    assert cached == len(covered)
    assert ids == fresh_ids
    np.testing.assert_allclose(logprobs, fresh_logprobs, atol=1e-4, rtol=0)
    return full_ids, full_logprobs
