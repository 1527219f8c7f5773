"""Fixtures for the proxy's unit tests: the bundled chat template, and an in-process reference
engine behind ASGI."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from gyre_proxy.engines import EngineClient, EngineClientConfig, qwen_tokenizer
from gyre_proxy.engines.refengine import ReferenceEngine, ReferenceEngineConfig, build_app
from gyre_proxy.ingest import Qwen3Template


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def template() -> Qwen3Template:
    """The bundled Qwen3 chat template over the bundled vocabulary (built once per module)."""
    return Qwen3Template(qwen_tokenizer())


@pytest.fixture(scope="module")
def engine() -> Iterator[ReferenceEngine]:
    with ReferenceEngine(ReferenceEngineConfig(max_context=256, seed=0)) as running:
        yield running


@pytest.fixture
async def asgi_client(engine: ReferenceEngine) -> AsyncIterator[EngineClient]:
    transport = httpx.ASGITransport(app=build_app(engine))
    async with EngineClient(EngineClientConfig("http://engine"), transport=transport) as client:
        yield client
