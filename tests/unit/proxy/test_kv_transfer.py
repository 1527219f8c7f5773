"""The Mooncake path of KV migration without Mooncake. Covered here: the client's calls and
typed errors (mock transport), the checks a destination makes on a descriptor before it reads,
an engine whose Mooncake is off or does not import, and the engine's bookkeeping of exposed
payloads over a recording ``KvTransfer``. The transfer itself is tested in
``tests/integration/proxy/test_kv_mooncake.py``."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import httpx
import msgspec
import numpy as np
import pytest
import torch

from gyre_proxy.engines import (
    EngineClient,
    EngineClientConfig,
    ExposedKv,
    KvCacheFull,
    KvCacheIncompatible,
    KvMigrationUnsupported,
    KvTransferFailed,
    KvTransferUnsupported,
)
from gyre_proxy.engines import wire as engine_api
from gyre_proxy.engines.refengine import ReferenceEngine, ReferenceEngineConfig, build_app
from gyre_proxy.engines.refengine.kvcache import CacheLayout, KvEntry
from gyre_proxy.engines.refengine.kvmooncake import MooncakeConfig, MooncakeKvTransfer
from gyre_proxy.engines.refengine.kvpayload import MAX_HEADER_BYTES, check_descriptor, pack, unpack
from gyre_proxy.exceptions import (
    KvStoreFull,
    PayloadIncompatible,
    PinNotFound,
    TransferFailed,
    TransferUnavailable,
)

pytestmark = pytest.mark.anyio

LAYOUT = CacheLayout("qwen3", num_layers=2, num_kv_heads=2, head_dim=16, dtype=torch.float32)
DESCRIPTOR = ExposedKv("r", 10, "default", 5_500, "127.0.0.1:15000", 0x7F0000001000, "tcp")


def entry(n: int, *, rid: str = "r", seed: int = 0) -> KvEntry:
    """A cache of ``n`` positions in LAYOUT, with distinct random values."""
    rng = torch.Generator().manual_seed(seed)
    tensors = [torch.randn((2, n, 16), generator=rng) for _ in range(4)]
    ids = np.arange(3, 3 + n, dtype=np.int32)
    return KvEntry(rid, ids, (tensors[0], tensors[1]), (tensors[2], tensors[3]), "default")


# -- the client ---------------------------------------------------------------------------------


def _answering(status: int, body: object, seen: list[httpx.Request] | None = None) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        return httpx.Response(status, content=msgspec.json.encode(body))

    return httpx.MockTransport(handler)


async def test_client_exposes_and_pulls_with_the_descriptor_the_engine_answers() -> None:
    seen: list[httpx.Request] = []
    wire = msgspec.to_builtins(DESCRIPTOR.to_wire())
    async with EngineClient(EngineClientConfig("http://e"), transport=_answering(200, wire, seen)) as client:
        assert await client.expose_kv("r") == DESCRIPTOR
    imported = {"key": "r", "num_tokens": 10, "nbytes": 5_200}
    async with EngineClient(
        EngineClientConfig("http://e"), transport=_answering(200, imported, seen)
    ) as client:
        answer = await client.pull_kv(DESCRIPTOR)
    assert (answer.key, answer.num_tokens, answer.nbytes) == ("r", 10, 5_200)
    expose, pull = seen
    assert (expose.url.path, msgspec.json.decode(expose.content)) == ("/gyre/kv/expose", {"rid": "r"})
    # The destination is handed every field, the address as a plain integer.
    assert (pull.url.path, msgspec.json.decode(pull.content)) == ("/gyre/kv/pull", wire)
    assert ExposedKv.from_wire(engine_api.decode(pull.content, engine_api.KvTransferDescriptor)) == DESCRIPTOR


@pytest.mark.parametrize(
    ("code", "error"),
    [
        (engine_api.KV_TRANSFER_UNSUPPORTED, KvTransferUnsupported),
        (engine_api.KV_TRANSFER_FAILED, KvTransferFailed),
        (engine_api.KV_INCOMPATIBLE, KvCacheIncompatible),
        (engine_api.KV_CACHE_FULL, KvCacheFull),
    ],
)
async def test_client_turns_the_transfer_codes_into_typed_errors(code: str, error: type[Exception]) -> None:
    body = {"error": {"message": f"refused: {code}", "code": code}}
    async with EngineClient(EngineClientConfig("http://e"), transport=_answering(501, body)) as client:
        with pytest.raises(error, match=f"refused: {code}"):
            await client.expose_kv("r")
        with pytest.raises(error):
            await client.pull_kv(DESCRIPTOR)


async def test_an_engine_without_the_mooncake_endpoints_is_transfer_unsupported() -> None:
    """An engine from before the Mooncake path (or SGLang) answers 404: the Mooncake calls are
    ``KvTransferUnsupported``, so the caller goes on to the HTTP ones, which SGLang refuses too."""
    transport = _answering(404, {"detail": "Not Found"})
    async with EngineClient(EngineClientConfig("http://e"), transport=transport) as client:
        with pytest.raises(KvTransferUnsupported, match="no KV-migration endpoint"):
            await client.expose_kv("r")
        with pytest.raises(KvTransferUnsupported):
            await client.pull_kv(DESCRIPTOR)
        with pytest.raises(KvMigrationUnsupported):
            await client.export_kv("r")


# -- checks before the read ---------------------------------------------------------------------


def _descriptor(**fields: object) -> engine_api.KvTransferDescriptor:
    data = pack(entry(10), LAYOUT)
    base = {**msgspec.to_builtins(DESCRIPTOR.to_wire()), "nbytes": len(data)}
    return msgspec.convert({**base, **fields}, engine_api.KvTransferDescriptor)


def _check(descriptor: engine_api.KvTransferDescriptor, max_bytes: int = 1 << 30) -> None:
    check_descriptor(descriptor, LAYOUT, weight_version="default", context_length=64, max_bytes=max_bytes)


def test_a_descriptor_of_a_real_payload_passes_the_checks() -> None:
    _check(_descriptor())
    tensors = 10 * (LAYOUT.bytes_per_token() + 4)
    _check(_descriptor(), max_bytes=tensors)  # exactly what the entry will hold


@pytest.mark.parametrize(
    ("fields", "max_bytes", "error", "message"),
    [
        ({"weight_version": "v2"}, 1 << 30, PayloadIncompatible, "weight version 'v2'"),
        ({"num_tokens": 0}, 1 << 30, PayloadIncompatible, "1 to 63"),
        ({"num_tokens": 64}, 1 << 30, PayloadIncompatible, "1 to 63"),
        ({}, 10 * 516 - 1, KvStoreFull, "import bound"),
        ({"nbytes": 10 * 516 + 8}, 1 << 30, PayloadIncompatible, "header"),
        ({"nbytes": 10 * 516 + 9 + MAX_HEADER_BYTES}, 1 << 30, PayloadIncompatible, "header"),
        ({"num_tokens": 20}, 1 << 30, PayloadIncompatible, "header"),  # the length is of 10
    ],
)
def test_a_descriptor_the_destination_could_not_keep_is_refused_before_reading(
    fields: dict[str, object], max_bytes: int, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        _check(_descriptor(**fields), max_bytes=max_bytes)


# -- an engine without Mooncake -----------------------------------------------------------------


def test_mooncake_that_does_not_import_is_unavailable_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mooncake.engine", None)  # import mooncake.engine now fails
    transfer = MooncakeKvTransfer(MooncakeConfig())
    usable, why = transfer.status()
    assert not usable and "does not import" in why and "libibverbs1" in why
    with pytest.raises(TransferUnavailable, match="does not import"):
        transfer.expose(b"payload")
    with pytest.raises(TransferUnavailable, match="does not import"):
        transfer.read("127.0.0.1:1", 0x1000, 8)


async def test_an_engine_with_mooncake_off_refuses_both_calls_typed_and_says_so() -> None:
    config = ReferenceEngineConfig(max_context=256, mooncake=MooncakeConfig(enabled=False))
    with ReferenceEngine(config) as engine:
        engine.loop.pinned.add(entry(10))
        transport = httpx.ASGITransport(app=build_app(engine))
        async with EngineClient(EngineClientConfig("http://engine"), transport=transport) as client:
            status = await client.kv_status()
            assert not status.mooncake and "off in this engine's config" in status.mooncake_detail
            with pytest.raises(KvTransferUnsupported, match="off in this engine's config"):
                await client.expose_kv("r")
            with pytest.raises(KvTransferUnsupported, match="off"):  # refused before the rid is looked up
                await client.expose_kv("no-such-request")
            with pytest.raises(KvTransferUnsupported, match="off"):
                await client.pull_kv(DESCRIPTOR)
            # The HTTP path is there all the same.
            assert (await client.export_kv("r")).num_tokens == 10


# -- the engine's exposures, over a recording transfer ----------------------------------------------


class RecordingTransfer:
    """A ``KvTransfer`` that keeps exposed bytes in a dict (one process, no Mooncake) and
    records what the engine asks of it."""

    protocol = "tcp"

    def __init__(self) -> None:
        self.memory: dict[int, bytes] = {}
        self.withdrawn: list[int] = []
        self.reads = 0
        self._next = 0x1000

    def status(self) -> tuple[bool, str]:
        return True, "tcp on test:1"

    def expose(self, data: bytes) -> tuple[str, int]:
        address, self._next = self._next, self._next + len(data)
        self.memory[address] = data
        return "test:1", address

    def withdraw(self, address: int) -> None:
        self.withdrawn.append(address)
        del self.memory[address]

    def read(self, segment: str, address: int, nbytes: int) -> bytes:
        self.reads += 1
        data = self.memory.get(address)
        if segment != "test:1" or data is None or len(data) != nbytes:
            raise TransferFailed(f"nothing exposed at {address:#x}")
        return data

    def close(self) -> None:
        self.memory.clear()


@pytest.fixture
def engine() -> Iterator[ReferenceEngine]:
    with ReferenceEngine(ReferenceEngineConfig(max_context=256, seed=0)) as running:
        running.kv_transfer = RecordingTransfer()
        yield running


def _wire(engine: ReferenceEngine, rid: str) -> engine_api.KvTransferDescriptor:
    exposure = engine.exposed.get(rid)
    assert exposure is not None
    e = exposure.entry
    return engine_api.KvTransferDescriptor(
        rid=rid, num_tokens=e.num_tokens, weight_version=e.weight_version, nbytes=len(exposure.data),
        segment=exposure.segment, address=exposure.address, protocol="tcp",
    )  # fmt: skip


async def test_an_exposed_payload_is_the_export_and_is_withdrawn_with_its_pin(
    engine: ReferenceEngine,
) -> None:
    transfer = engine.kv_transfer
    assert isinstance(transfer, RecordingTransfer)
    pinned = entry(10)
    engine.loop.pinned.add(pinned)
    first = await engine.expose_kv("r")
    assert await engine.expose_kv("r") is first and len(transfer.memory) == 1  # registered once
    # The bytes the HTTP export answers (the same object: packed once), of the pinned tensors.
    assert await engine.export_kv("r") is first.data
    read = unpack(first.data, LAYOUT, weight_version="default", vocab_size=320, context_length=256)
    pairs = zip(read.keys + read.values, pinned.keys + pinned.values, strict=True)
    assert all(torch.equal(ours, theirs) for ours, theirs in pairs)
    assert engine.exposed.totals() == (1, len(first.data))

    # A new pin of the same rid (a later request reusing it) exposes its own payload.
    engine.loop.pinned.add(entry(12, seed=1))
    second = await engine.expose_kv("r")
    assert second.address != first.address and transfer.withdrawn == [first.address]

    engine.release_kv("r")
    assert transfer.withdrawn == [first.address, second.address] and transfer.memory == {}
    assert engine.exposed.totals() == (0, 0)
    with pytest.raises(PinNotFound):
        await engine.expose_kv("r")
    with pytest.raises(PinNotFound):
        engine.release_kv("r")


async def test_a_pulled_payload_is_kept_as_an_http_import_would_be(engine: ReferenceEngine) -> None:
    transfer = engine.kv_transfer
    assert isinstance(transfer, RecordingTransfer)
    pinned = entry(10)
    engine.loop.pinned.add(pinned)
    await engine.expose_kv("r")
    key, kept = await engine.pull_kv(_wire(engine, "r"))
    assert key == "r" and kept.token_ids.tolist() == pinned.token_ids.tolist()
    for ours, theirs in zip((*kept.keys, *kept.values), (*pinned.keys, *pinned.values), strict=True):
        assert torch.equal(ours, theirs)
    assert engine.loop.prefixes.totals() == (1, pinned.nbytes)

    # Bytes at the address that are another request's payload of the same size: nothing kept.
    engine.flush_prefix_cache()
    engine.loop.pinned.add(entry(10, rid="s", seed=2))
    await engine.expose_kv("s")
    swapped = msgspec.structs.replace(_wire(engine, "r"), address=_wire(engine, "s").address)
    with pytest.raises(PayloadIncompatible, match="not of 'r'"):
        await engine.pull_kv(swapped)
    # Refused from the descriptor alone: no read at all.
    reads = transfer.reads
    with pytest.raises(PayloadIncompatible, match="weight version"):
        await engine.pull_kv(msgspec.structs.replace(_wire(engine, "r"), weight_version="v2"))
    with pytest.raises(TransferUnavailable, match="'rdma'"):
        await engine.pull_kv(msgspec.structs.replace(_wire(engine, "r"), protocol="rdma"))
    assert transfer.reads == reads and engine.loop.prefixes.totals() == (0, 0)
