"""KV-cache migration between reference engines over real HTTP on loopback.

Engine A is the source, B the destination, C a fresh engine (the same seed, so the same
weights) whose full prefill is the reference; D serves another model. A request streaming on
A is pinned-and-aborted mid-decode, exported from A, imported into B, and continued on B.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import numpy as np
import pytest
from safetensors.torch import load, save

from gyre_proxy.engines import (
    EngineClient,
    EngineClientConfig,
    FinishKind,
    KvCacheFull,
    KvCacheIncompatible,
    KvCacheNotFound,
    KvPayload,
    SamplingConfig,
)
from gyre_proxy.engines.refengine import ReferenceEngineConfig
from gyre_proxy.engines.refengine import ReferenceEngineServer as Server
from gyre_proxy.engines.refengine.decode_loop import PIN_ABORT_MESSAGE
from gyre_proxy.engines.refengine.kvstore import KvLimits
from gyre_proxy.engines.weights import GYRE_SAFETENSORS_FORMAT, serialize_safetensors
from gyre_proxy.engines.wire import read_kv_payload
from tests.integration.proxy.kv_engines import (
    CONTEXT,
    GREEDY,
    OTHER,
    SAME,
    Streaming,
    continues_like_a_full_prefill,
    raw_generate,
    start_streaming,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

PROMPT = [int(x) for x in np.random.default_rng(7).integers(3, 250, size=120)]


@dataclass(frozen=True)
class Engines:
    a: Server
    b: Server
    c: Server
    d: Server  # another model: three layers


@pytest.fixture(scope="module")
def engines() -> Iterator[Engines]:
    with Server(SAME) as a, Server(SAME) as b, Server(SAME) as c, Server(OTHER) as d:
        yield Engines(a, b, c, d)


@pytest.fixture
async def clients(engines: Engines) -> AsyncIterator[tuple[EngineClient, ...]]:
    made = [
        EngineClient(EngineClientConfig(s.base_url, timeout_s=120))
        for s in (engines.a, engines.b, engines.c, engines.d)
    ]
    # Every migration here continues the same greedy stream, so an entry another test left on
    # the destination would share the prefix: each test starts with none.
    await made[1].flush_cache()
    yield tuple(made)
    for client in made:
        await client.aclose()


async def migrate(source: EngineClient, rid: str) -> tuple[Streaming, KvPayload]:
    streaming = await start_streaming(source, rid, PROMPT)
    payload = await source.pin_and_export(rid)
    assert await streaming.task is FinishKind.ABORT
    return streaming, payload


async def test_a_pinned_request_continues_on_another_engine_without_prefilling_its_context(
    engines: Engines, clients: tuple[EngineClient, ...]
) -> None:
    a, b, _c, _d = clients
    streaming, payload = await migrate(a, "mig-1")

    # The source aborted it like /abort_request, after it had produced tokens, and the pinned
    # cache covers the prompt and every token the stream delivered.
    assert streaming.message == [PIN_ABORT_MESSAGE]
    covered = PROMPT + streaming.tokens
    assert payload.token_ids.tolist() == covered and payload.rid == "mig-1"
    assert len(streaming.tokens) >= 8

    imported = await b.import_kv(payload)
    assert (imported.key, imported.num_tokens) == ("mig-1", len(covered))

    # The proxy's retry: the original input plus the tokens the harness got. All but the last
    # position come from the import; the result is that of a fresh engine's full prefill. A
    # retry that carries more than the cache covers reuses all of it.
    full_ids, full_logprobs = await continues_like_a_full_prefill(engines.b, engines.c, covered)

    # A prompt sharing nothing with it is prefilled whole.
    _, _, cached = await raw_generate(engines.b, [251, *PROMPT[1:]])
    assert cached == 0

    # The client's own generate sees the same continuation.
    result = await b.generate(covered, GREEDY)
    assert result.output_ids.tolist() == full_ids
    np.testing.assert_allclose(result.logprobs, full_logprobs, atol=1e-4, rtol=0)

    # Released once the destination took over: gone from the source.
    status = await a.release_kv("mig-1")
    assert (status.pinned_entries, status.pinned_bytes) == (0, 0)
    with pytest.raises(KvCacheNotFound):
        await a.export_kv("mig-1")
    with pytest.raises(KvCacheNotFound):
        await a.release_kv("mig-1")


async def test_the_continuation_streams_the_tokens_the_source_would_have_produced(
    engines: Engines, clients: tuple[EngineClient, ...]
) -> None:
    """Greedy decoding resumed on B from the migrated KV yields what A was about to produce."""
    a, b, c, _d = clients
    streaming, payload = await migrate(a, "mig-2")
    await b.import_kv(payload)
    continued: list[int] = []
    async for delta in b.generate_stream(payload.token_ids.tolist(), GREEDY, rid="cont-2"):
        continued.extend(delta.output_ids.tolist())
    uninterrupted = await c.generate(
        PROMPT, SamplingConfig(max_new_tokens=len(streaming.tokens) + 24, temperature=0.0, ignore_eos=True)
    )
    assert streaming.tokens + continued == uninterrupted.output_ids.tolist()
    await a.release_kv("mig-2")


async def test_pin_of_a_request_that_is_not_decoding_is_not_found(clients: tuple[EngineClient, ...]) -> None:
    a, *_ = clients
    with pytest.raises(KvCacheNotFound, match="not decoding"):
        await a.pin_and_abort("never-started")
    finished = await a.generate(PROMPT[:10], GREEDY, rid="done-1")
    assert finished.finish.kind is FinishKind.LENGTH
    with pytest.raises(KvCacheNotFound):
        await a.pin_and_export("done-1")


async def test_a_payload_of_another_model_is_refused(
    engines: Engines, clients: tuple[EngineClient, ...]
) -> None:
    a, b, _c, d = clients
    _, payload = await migrate(a, "mig-3")
    try:
        with pytest.raises(KvCacheIncompatible, match="layers"):
            await d.import_kv(payload)  # three layers, the payload two
        _, foreign = await migrate(d, "mig-3d")
        with pytest.raises(KvCacheIncompatible, match="layers"):
            await b.import_kv(foreign)
        await d.release_kv("mig-3d")
        with pytest.raises(KvCacheIncompatible, match="outside the payload"):
            await b.import_kv(payload.data[: len(payload.data) // 2])
    finally:
        await a.release_kv("mig-3")


async def test_a_payload_of_other_weights_is_refused(
    engines: Engines, clients: tuple[EngineClient, ...]
) -> None:
    a, _b, c, _d = clients
    _, payload = await migrate(a, "mig-4")
    await c.update_weight_version("v-next")
    try:
        with pytest.raises(KvCacheIncompatible, match="weight version"):
            await c.import_kv(payload)
    finally:
        await c.update_weight_version("default")
        await a.release_kv("mig-4")


async def test_the_pin_bound_refuses_and_leaves_the_request_decoding() -> None:
    config = ReferenceEngineConfig(max_context=CONTEXT, kv_pins=KvLimits(max_entries=1))
    with Server(config) as server:
        async with EngineClient(EngineClientConfig(server.base_url, timeout_s=120)) as engine:
            _, first = await migrate(engine, "bound-1")
            second = await start_streaming(engine, "bound-2", PROMPT[:60])
            with pytest.raises(KvCacheFull, match="bound is 1 caches"):
                await engine.pin_and_abort("bound-2")
            # Refused: the request was not aborted and goes on producing tokens.
            seen = len(second.tokens)
            while len(second.tokens) < seen + 5:
                assert not second.task.done()
                await asyncio.sleep(0.005)
            await engine.release_kv("bound-1")
            pinned = await engine.pin_and_abort("bound-2")
            assert await second.task is FinishKind.ABORT
            assert pinned.num_tokens == 60 + len(second.tokens)
            status = await engine.release_kv("bound-2")
            assert status.pinned_entries == 0 and first.num_tokens > len(PROMPT)

    small = ReferenceEngineConfig(max_context=CONTEXT, kv_pins=KvLimits(max_bytes=10_000))
    with Server(small) as server:
        async with EngineClient(EngineClientConfig(server.base_url, timeout_s=120)) as engine:
            streaming = await start_streaming(engine, "bytes-1", PROMPT)
            with pytest.raises(KvCacheFull, match="10000 bytes"):
                await engine.pin_and_abort("bytes-1")
            await engine.abort("bytes-1")
            assert await streaming.task is FinishKind.ABORT


async def test_the_import_bound_refuses_a_payload_larger_than_itself(
    clients: tuple[EngineClient, ...],
) -> None:
    a, *_ = clients
    _, payload = await migrate(a, "mig-5")
    config = ReferenceEngineConfig(max_context=CONTEXT, kv_imports=KvLimits(max_bytes=payload.nbytes // 2))
    try:
        with Server(config) as server:
            async with EngineClient(EngineClientConfig(server.base_url, timeout_s=120)) as engine:
                with pytest.raises(KvCacheFull, match="import bound"):
                    await engine.import_kv(payload)
                assert (await engine.kv_status()).imported_entries == 0
    finally:
        await a.release_kv("mig-5")


async def test_weight_updates_and_flush_cache_drop_imported_caches(
    engines: Engines, clients: tuple[EngineClient, ...]
) -> None:
    """Imported KV was computed under the weights of its import: a weight update (even to the
    same version name) and ``/flush_cache`` drop it, so a later request prefills in full."""
    a, b, _c, _d = clients
    _, payload = await migrate(a, "mig-6")
    covered = payload.token_ids.tolist()
    try:
        await b.import_kv(payload)
        assert (await raw_generate(engines.b, covered))[2] == len(covered) - 1
        name = "model.norm.weight"
        same = serialize_safetensors({name: engines.b.engine.loaded.model.state_dict()[name].clone()})
        await b.update_weights_from_tensor(
            [same], weight_version="default", load_format=GYRE_SAFETENSORS_FORMAT
        )
        assert (await raw_generate(engines.b, covered))[2] == 0

        await b.import_kv(payload)
        assert (await b.kv_status()).imported_entries == 1
        await b.flush_cache()
        assert (await b.kv_status()).imported_entries == 0
        assert (await raw_generate(engines.b, covered))[2] == 0
    finally:
        await a.release_kv("mig-6")


async def test_the_destination_computes_from_the_imported_kv_not_from_the_tokens(
    engines: Engines, clients: tuple[EngineClient, ...]
) -> None:
    """An imported cache whose values were doubled changes the continuation's logprobs: the
    reused positions are read from the payload, not recomputed from its token ids."""
    a, b, _c, _d = clients
    _, payload = await migrate(a, "mig-7")
    await a.release_kv("mig-7")
    header = read_kv_payload(payload.data)
    tensors = {name: t * 2 if name.startswith("values.") else t for name, t in load(payload.data).items()}
    doctored = save(tensors, metadata=header.meta.to_strings())
    await b.import_kv(doctored)
    covered = payload.token_ids.tolist()
    _, logprobs, cached = await raw_generate(engines.b, covered)
    _, full_logprobs, _ = await raw_generate(engines.c, covered)
    assert cached == len(covered) - 1
    assert np.abs(np.asarray(logprobs) - np.asarray(full_logprobs)).max() > 1e-3
