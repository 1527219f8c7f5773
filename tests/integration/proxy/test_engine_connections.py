"""The engine client's TCP connections, counted by a relay in front of the reference engine.

A finished stream must hand its connection back for the next request (a new connection per
request cost about 1 ms of proxy CPU), and a stream closed early must close its connection,
since that is how SGLang learns to abort the request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

import numpy as np
import pytest

from gyre_proxy.engines import EngineClient, EngineClientConfig, FinishKind, SamplingConfig
from gyre_proxy.engines.refengine import ReferenceEngineConfig, ReferenceEngineServer

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


class CountingRelay:
    """A TCP relay to ``port`` that counts the connections it accepted and those still open."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.accepted = 0
        self.open = 0
        self.closed = asyncio.Event()
        self._server: asyncio.Server | None = None

    @property
    def base_url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self.open += 1
        engine_r, engine_w = await asyncio.open_connection("127.0.0.1", self.port)

        async def pump(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError):
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            w.close()

        await asyncio.gather(pump(client_r, engine_w), pump(engine_r, client_w))
        self.open -= 1
        self.closed.set()


@pytest.fixture(scope="module")
def engine() -> Iterator[ReferenceEngineServer]:
    with ReferenceEngineServer(ReferenceEngineConfig(max_context=512, seed=0)) as server:
        yield server


@pytest.fixture
async def relay(engine: ReferenceEngineServer) -> AsyncIterator[CountingRelay]:
    running = CountingRelay(engine.port)
    await running.start()
    yield running
    await running.stop()


def prompt(seed: int) -> list[int]:
    return [int(x) for x in np.random.default_rng(seed).integers(3, 250, size=10)]


async def test_sequential_streams_share_one_connection(relay: CountingRelay) -> None:
    sampling = SamplingConfig(max_new_tokens=4, temperature=0.0, ignore_eos=True)
    async with EngineClient(EngineClientConfig(relay.base_url, timeout_s=60)) as client:
        for i in range(5):
            deltas = [d async for d in client.generate_stream(prompt(i), sampling)]
            assert deltas[-1].finish is not None and deltas[-1].finish.kind is FinishKind.LENGTH
            assert sum(len(d.output_ids) for d in deltas) == 4
        # numpy ids (what the answer pipeline holds) go over the same connection
        ids = np.array(prompt(9), dtype=np.int32)
        deltas = [d async for d in client.generate_stream(ids, sampling)]  # type: ignore[arg-type]
        assert deltas[-1].finish is not None
    assert relay.accepted == 1


async def test_a_stream_closed_early_closes_its_connection(relay: CountingRelay) -> None:
    sampling = SamplingConfig(max_new_tokens=400, temperature=1.0, ignore_eos=True, seed=1)
    async with EngineClient(EngineClientConfig(relay.base_url, timeout_s=60)) as client:
        stream = client.generate_stream(prompt(1), sampling)
        first = await anext(stream)
        assert first.finish is None
        await stream.aclose()  # what the proxy does when the harness goes away
        await asyncio.wait_for(relay.closed.wait(), 10)
        assert relay.open == 0
        deltas = [d async for d in client.generate_stream(prompt(2), SamplingConfig(max_new_tokens=2))]
        assert deltas[-1].finish is not None
    assert relay.accepted == 2
