"""KV-cache migration over Mooncake Transfer Engine between reference engines on loopback.

A is the source and B the destination; both have Mooncake. C is a fresh engine with the same
seed, so the same weights, and its full prefill is the reference. D serves another model
(three layers). N has Mooncake turned off. A request streams on A, is pinned mid-decode, and
its payload is exposed from A's memory. B reads it over Mooncake (TCP here) and the request
continues on B; the payload never passes through this process. Where either end has no
Mooncake, the refusal is typed and the HTTP path moves the same cache. The tests that need
Mooncake fail when it does not import, unless GYRE_TEST_SKIP_MOONCAKE=1 (``tests/real_servers.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from gyre_proxy.engines import (
    EngineClient,
    EngineClientConfig,
    ExposedKv,
    FinishKind,
    KvCacheFull,
    KvCacheIncompatible,
    KvCacheNotFound,
    KvTransferFailed,
    KvTransferUnsupported,
)
from gyre_proxy.engines.refengine import MooncakeConfig, ReferenceEngineConfig
from gyre_proxy.engines.refengine import ReferenceEngineServer as Server
from gyre_proxy.engines.refengine.decode_loop import PIN_ABORT_MESSAGE
from gyre_proxy.engines.refengine.kvstore import KvLimits
from tests.integration.proxy.kv_engines import (
    CONTEXT,
    OTHER,
    SAME,
    continues_like_a_full_prefill,
    start_streaming,
)
from tests.real_servers import mooncake_missing, unavailable

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

PROMPT = [int(x) for x in np.random.default_rng(11).integers(3, 250, size=120)]
OFF = MooncakeConfig(enabled=False)


@dataclass(frozen=True)
class Engines:
    a: Server
    b: Server
    c: Server
    d: Server  # another model: three layers
    n: Server  # Mooncake off


@pytest.fixture(scope="module")
def engines() -> Iterator[Engines]:
    off = dataclasses.replace(SAME, mooncake=OFF)
    with Server(SAME) as a, Server(SAME) as b, Server(SAME) as c, Server(OTHER) as d, Server(off) as n:
        yield Engines(a, b, c, d, n)


@dataclass(frozen=True)
class Clients:
    a: EngineClient
    b: EngineClient
    c: EngineClient
    d: EngineClient
    n: EngineClient

    def all(self) -> tuple[EngineClient, ...]:
        return (self.a, self.b, self.c, self.d, self.n)


@pytest.fixture
async def clients(engines: Engines) -> AsyncIterator[Clients]:
    servers = (engines.a, engines.b, engines.c, engines.d, engines.n)
    made = Clients(*(EngineClient(EngineClientConfig(s.base_url, timeout_s=120)) for s in servers))
    # Every move here continues the same greedy stream, so an entry another test left would
    # share its prefix: every test starts with no imported entry anywhere.
    for client in made.all():
        await client.flush_cache()
    yield made
    for client in made.all():
        await client.aclose()


async def stream_and_pin(client: EngineClient, rid: str, at_least: int = 8) -> list[int]:
    """Stream PROMPT greedily on ``client``'s engine, pin it once it has produced ``at_least``
    tokens, and return the ids its pinned cache covers (the prompt and every token streamed)."""
    streaming = await start_streaming(client, rid, PROMPT, at_least)
    pinned = await client.pin_and_abort(rid)
    assert (await streaming.task, streaming.message) == (FinishKind.ABORT, [PIN_ABORT_MESSAGE])
    assert pinned.num_tokens == len(PROMPT) + len(streaming.tokens)
    return PROMPT + streaming.tokens


async def test_a_pinned_request_moves_over_mooncake_and_continues_like_a_full_prefill(
    engines: Engines, clients: Clients
) -> None:
    if (missing := mooncake_missing()) is not None:
        unavailable("mooncake", missing)
    covered = await stream_and_pin(clients.a, "mc-1")
    status = await clients.a.kv_status()
    assert status.mooncake and status.exposed_entries == 0, status
    exposed = await clients.a.expose_kv("mc-1")
    started = await clients.a.kv_status()
    # The descriptor points into A's own Transfer Engine, at the bytes the HTTP export answers.
    assert (exposed.rid, exposed.num_tokens, exposed.protocol) == ("mc-1", len(covered), "tcp")
    assert started.mooncake_detail == f"tcp on {exposed.segment}"
    assert exposed.nbytes == len((await clients.a.export_kv("mc-1")).data) == started.exposed_bytes
    assert await clients.a.expose_kv("mc-1") == exposed  # exposing again: the same registration

    imported = await clients.b.pull_kv(exposed)
    assert (imported.key, imported.num_tokens) == ("mc-1", len(covered))

    # B keeps exactly the tensors A pinned, read from A's memory.
    pinned = engines.a.engine.loop.pinned.get("mc-1")
    found = engines.b.engine.loop.prefixes.match([*covered, 0], "default")
    assert found is not None and found[1] == len(covered)
    kept = found[0]
    assert kept.token_ids.tolist() == covered
    for ours, theirs in zip((*kept.keys, *kept.values), (*pinned.keys, *pinned.values), strict=True):
        assert torch.equal(ours, theirs)

    await continues_like_a_full_prefill(engines.b, engines.c, covered)
    await clients.a.release_kv("mc-1")


async def test_the_source_exposes_the_payload_until_the_release_after_the_import(clients: Clients) -> None:
    if (missing := mooncake_missing()) is not None:
        unavailable("mooncake", missing)
    covered = await stream_and_pin(clients.a, "mc-2")
    exposed = await clients.a.expose_kv("mc-2")
    await clients.b.pull_kv(exposed)
    # The destination has taken over but the source has not been told: it still holds the pin
    # and the registered payload, which another destination can still read.
    held = await clients.a.kv_status()
    assert (held.pinned_entries, held.exposed_entries, held.exposed_bytes) == (1, 1, exposed.nbytes)
    assert (await clients.c.pull_kv(exposed)).num_tokens == len(covered)

    released = await clients.a.release_kv("mc-2")
    assert (released.pinned_entries, released.pinned_bytes) == (0, 0)
    assert (released.exposed_entries, released.exposed_bytes) == (0, 0)
    # Unregistered: A's Transfer Engine refuses a read of those bytes now, and nothing is kept.
    await clients.b.flush_cache()
    with pytest.raises(KvTransferFailed, match="no longer exposes"):
        await clients.b.pull_kv(exposed)
    assert (await clients.b.kv_status()).imported_entries == 0
    with pytest.raises(KvCacheNotFound):
        await clients.a.expose_kv("mc-2")
    with pytest.raises(KvCacheNotFound):
        await clients.a.release_kv("mc-2")


async def test_a_destination_without_mooncake_refuses_and_the_http_path_moves_the_cache(
    engines: Engines, clients: Clients
) -> None:
    if (missing := mooncake_missing()) is not None:
        unavailable("mooncake", missing)
    status = await clients.n.kv_status()
    assert not status.mooncake and "off in this engine's config" in status.mooncake_detail
    covered = await stream_and_pin(clients.a, "mc-3")
    try:
        exposed = await clients.a.expose_kv("mc-3")
        with pytest.raises(KvTransferUnsupported, match="off in this engine's config"):
            await clients.n.pull_kv(exposed)
        assert (await clients.n.kv_status()).imported_entries == 0
        # The pin is still there: the same cache moves over HTTP.
        imported = await clients.n.import_kv(await clients.a.export_kv("mc-3"))
        assert imported.num_tokens == len(covered)
        await continues_like_a_full_prefill(engines.n, engines.c, covered)
    finally:
        await clients.a.release_kv("mc-3")


async def test_a_source_without_mooncake_refuses_and_the_http_path_moves_the_cache(
    engines: Engines, clients: Clients
) -> None:
    covered = await stream_and_pin(clients.n, "mc-4")
    try:
        with pytest.raises(KvTransferUnsupported, match="off in this engine's config"):
            await clients.n.expose_kv("mc-4")
        assert (await clients.n.kv_status()).exposed_entries == 0
        imported = await clients.b.import_kv(await clients.n.export_kv("mc-4"))
        assert imported.num_tokens == len(covered)
        await continues_like_a_full_prefill(engines.b, engines.c, covered)
    finally:
        await clients.n.release_kv("mc-4")


async def test_a_pull_is_checked_like_an_http_import(engines: Engines, clients: Clients) -> None:
    """The destination refuses what the descriptor already rules out before it reads a byte,
    and checks the bytes it read exactly as it checks an HTTP payload."""
    if (missing := mooncake_missing()) is not None:
        unavailable("mooncake", missing)
    await stream_and_pin(clients.a, "mc-5")
    await stream_and_pin(clients.d, "mc-5d")
    # The same cache pinned under a rid of the same length: a payload of the same size.
    twin = dataclasses.replace(engines.a.engine.loop.pinned.get("mc-5"), rid="mc-6")
    engines.a.engine.loop.pinned.add(twin)
    try:
        exposed = await clients.a.expose_kv("mc-5")
        other = await clients.a.expose_kv("mc-6")
        assert other.nbytes == exposed.nbytes and other.address != exposed.address
        refusals: list[tuple[ExposedKv, type[Exception], str]] = [
            (dataclasses.replace(exposed, weight_version="v-next"), KvCacheIncompatible, "weight version"),
            (dataclasses.replace(exposed, protocol="rdma"), KvTransferUnsupported, "'rdma'"),
            (dataclasses.replace(exposed, nbytes=exposed.nbytes + (2 << 20)), KvCacheIncompatible, "header"),
            (dataclasses.replace(exposed, nbytes=8), KvCacheIncompatible, "header"),
            (dataclasses.replace(exposed, num_tokens=CONTEXT), KvCacheIncompatible, "1 to 1023"),
            # The bytes at that address are another request's payload: nothing is kept.
            (dataclasses.replace(exposed, address=other.address), KvCacheIncompatible, "not of 'mc-5'"),
            # Past the end of what A exposes there, and where A exposes nothing.
            (dataclasses.replace(exposed, address=exposed.address + 8), KvTransferFailed, "failed"),
            (dataclasses.replace(exposed, address=exposed.address + (1 << 30)), KvTransferFailed, "failed"),
        ]
        for descriptor, error, message in refusals:
            with pytest.raises(error, match=message):
                await clients.b.pull_kv(descriptor)
        # Another model's payload passes what the descriptor says and is refused once read.
        with pytest.raises(KvCacheIncompatible, match="layers"):
            await clients.b.pull_kv(await clients.d.expose_kv("mc-5d"))
        assert (await clients.b.kv_status()).imported_entries == 0

        small = ReferenceEngineConfig(max_context=CONTEXT, kv_imports=KvLimits(max_bytes=exposed.nbytes // 2))
        with Server(small) as server:
            async with EngineClient(EngineClientConfig(server.base_url, timeout_s=120)) as engine:
                with pytest.raises(KvCacheFull, match="import bound"):
                    await engine.pull_kv(exposed)
                assert (await engine.kv_status()).mooncake_detail.endswith("started at the first migration")
    finally:
        for client, rid in ((clients.a, "mc-5"), (clients.a, "mc-6"), (clients.d, "mc-5d")):
            await client.release_kv(rid)
