"""A publication while a request is in flight, on real reference engines over HTTP: each engine
is paused for the update (its requests in flight counted), the request goes on under the new
weights and finishes with every token and no error; without pausing, the update waits for it.
The SGLang case (marked ``sglang``) fails, not skips, when SGLang's environment is not built."""

from __future__ import annotations

import asyncio
import copy
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch

from gyre_proxy.engines import (
    EngineClient,
    EngineClientConfig,
    SamplingConfig,
    SGLangServer,
    SGLangServerConfig,
)
from gyre_proxy.engines.refengine import ModelSource, ReferenceEngineConfig, load_model, save_model_dir
from gyre_proxy.engines.refengine.runner import ReferenceEngineServer
from gyre_proxy.engines.weights import payloads
from gyre_store import EngineRegistered, InMemoryEventLog, NewEvent
from gyre_tools.run_config import sglang_missing, sglang_serve_command
from gyre_train.cells import LivePublisher
from tests.real_servers import require

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

PROMPT = [257, 72, 105, 258, 257, 40, 41]


class Weights:
    """A `PublishableModel`: the engine's model, moved a little (another policy version)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = copy.deepcopy(model)
        with torch.no_grad():
            for parameter in self.model.parameters():
                parameter.add_(0.01)

    def named_tensors(self) -> dict[str, torch.Tensor]:
        return {n: t.detach() for n, t in self.model.state_dict().items()}

    def save(self, path: Path) -> Path:
        return save_model_dir(self.model, path)


class Streamed(threading.Thread):
    """One streamed generation on its own thread: the versions its chunks report, its tokens,
    its finish, and any error."""

    def __init__(self, url: str, max_new_tokens: int) -> None:
        super().__init__(daemon=True)
        self.url, self.max_new_tokens = url, max_new_tokens
        self.started = threading.Event()
        self.versions: list[str | None] = []
        self.tokens = 0
        self.finish: str | None = None
        self.error: BaseException | None = None
        self.done_at = 0.0

    def run(self) -> None:
        async def stream() -> None:
            sampling = SamplingConfig(max_new_tokens=self.max_new_tokens, temperature=1.0, ignore_eos=True)
            async with EngineClient(EngineClientConfig(self.url, timeout_s=240)) as client:
                async for delta in client.generate_stream(PROMPT, sampling):
                    self.tokens += len(delta.output_ids)
                    if not self.versions or self.versions[-1] != delta.weight_version:
                        self.versions.append(delta.weight_version)
                    if self.tokens >= 5:
                        self.started.set()
                    if delta.finish is not None:
                        self.finish = delta.finish.kind.value

        try:
            asyncio.run(stream())
        except BaseException as exc:  # handed to the test
            self.error = exc
        finally:
            self.done_at = time.monotonic()
            self.started.set()


def _engines(log: InMemoryEventLog, servers: list[ReferenceEngineServer]) -> None:
    log.append(
        [
            NewEvent(EngineRegistered(engine=f"run:pool-{i}", run_id="run", url=s.base_url, capacity=2))
            for i, s in enumerate(servers)
        ]
    )


@pytest.mark.parametrize("method", ["disk", "distributed"])
def test_a_request_in_flight_is_paused_for_the_update_and_finishes_under_the_new_weights(
    tmp_path: Path, method: str
) -> None:
    config = ReferenceEngineConfig(max_context=4096, weight_version="0")
    with ReferenceEngineServer(config) as first, ReferenceEngineServer(config) as second:
        log = InMemoryEventLog()
        _engines(log, [first, second])
        request = Streamed(first.base_url, max_new_tokens=2000)
        request.start()
        assert request.started.wait(120) and request.error is None
        publisher = LivePublisher(log, "run", tmp_path, method=method, timeout_s=120)
        try:
            publisher.publish(Weights(first.engine.loaded.model), 1)
        finally:
            publisher.close()
        published_at = time.monotonic()
        request.join(240)

        assert request.error is None, request.error
        assert (request.finish, request.tokens) == ("length", 2000)  # every token, no abort
        assert request.versions == ["0", "1"]  # it went on under the new weights
        assert published_at < request.done_at  # the update did not wait for it
        event = publisher.publication_event(1, step=0)
        assert event.paused == {"run:pool-0": 1, "run:pool-1": 0}
        assert sorted(event.engines) == ["run:pool-0", "run:pool-1"] and event.skipped == ()
        assert (event.method, event.note) == (method, "")  # a broadcast, not the folder fallback
        for server in (first, second):
            assert server.engine.weight_version == "1" and not server.engine.paused


def test_a_tensor_publication_makes_one_payload_for_every_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[int] = []
    real = payloads.serialize_safetensors

    def counted(tensors: Mapping[str, torch.Tensor]) -> str:
        made.append(len(tensors))
        return real(tensors)

    monkeypatch.setattr(payloads, "serialize_safetensors", counted)
    config = ReferenceEngineConfig(max_context=4096, weight_version="0")
    with (
        ReferenceEngineServer(config) as a,
        ReferenceEngineServer(config) as b,
        ReferenceEngineServer(config) as c,
    ):
        log = InMemoryEventLog()
        _engines(log, [a, b, c])
        weights = Weights(a.engine.loaded.model)
        publisher = LivePublisher(log, "run", tmp_path, method="tensor", timeout_s=120)
        publisher.publish(weights, 1)
        assert len(made) == 1  # serialized once, sent to three engines
        event = publisher.publication_event(1, step=0)
        assert sorted(event.engines) == ["run:pool-0", "run:pool-1", "run:pool-2"] and event.skipped == ()
        expected = weights.named_tensors()
        for server in (a, b, c):
            assert server.engine.weight_version == "1"
            served = server.engine.loaded.model.state_dict()
            assert all(torch.equal(served[name], tensor) for name, tensor in expected.items())


def test_without_pausing_the_update_waits_for_the_request(tmp_path: Path) -> None:
    config = ReferenceEngineConfig(max_context=4096, weight_version="0")
    with ReferenceEngineServer(config) as engine:
        log = InMemoryEventLog()
        _engines(log, [engine])
        request = Streamed(engine.base_url, max_new_tokens=300)
        request.start()
        assert request.started.wait(120) and request.error is None
        publisher = LivePublisher(log, "run", tmp_path, method="disk", timeout_s=120, pause=False)
        publisher.publish(Weights(engine.engine.loaded.model), 1)
        published_at = time.monotonic()
        request.join(240)
        assert request.error is None and (request.finish, request.tokens) == ("length", 300)
        assert request.versions == ["0"]  # it finished before the update
        assert request.done_at <= published_at
        assert publisher.publication_event(1, step=0).paused == {}


def test_the_reference_engine_pauses_as_sglang_does(tmp_path: Path) -> None:
    """in_place and abort as SGLang's; retract refused; a request sent while paused waits."""
    with ReferenceEngineServer(ReferenceEngineConfig(max_context=4096)) as server:

        async def check() -> None:
            async with EngineClient(EngineClientConfig(server.base_url, timeout_s=60)) as client:
                with pytest.raises(Exception, match="not retract"):
                    await client.pause_generation("retract")
                assert not server.engine.paused
                await client.pause_generation("in_place")
                waiting = asyncio.create_task(client.generate(PROMPT, SamplingConfig(max_new_tokens=3)))
                await asyncio.sleep(0.5)
                assert not waiting.done() and await client.requests_in_flight() == 0  # held before the engine
                await client.continue_generation()
                assert len((await waiting).output_ids) == 3
                long = asyncio.create_task(
                    client.generate(PROMPT, SamplingConfig(max_new_tokens=2000, ignore_eos=True))
                )
                while await client.requests_in_flight() == 0:
                    await asyncio.sleep(0.01)
                await client.pause_generation("abort")  # returns once nothing is in flight
                assert await client.requests_in_flight() == 0
                assert (await long).finish.kind.value == "abort"
                await client.continue_generation()

        asyncio.run(check())


@pytest.mark.sglang
@pytest.mark.timeout(900)
def test_on_sglang_a_request_in_flight_is_retracted_for_the_update_and_finishes(tmp_path: Path) -> None:
    """The same on a real SGLang server (CPU): paused in retract mode, the update goes at once,
    the request is computed again under the new weights and finishes with every token."""
    require("sglang", sglang_missing())
    model = load_model(ModelSource(seed=0)).model
    folder = save_model_dir(model, tmp_path / "initial")
    config = SGLangServerConfig(tuple(sglang_serve_command()), folder, log_path=tmp_path / "sglang.log")
    with SGLangServer(config) as server:
        log = InMemoryEventLog()
        log.append([NewEvent(EngineRegistered(engine="run:pool-0", run_id="run", url=server.base_url))])
        request = Streamed(server.base_url, max_new_tokens=400)
        request.start()
        assert request.started.wait(300) and request.error is None
        publisher = LivePublisher(log, "run", tmp_path / "policies", method="disk", timeout_s=300)
        publisher.publish(Weights(model), 1)
        published_at = time.monotonic()
        request.join(600)
        assert request.error is None, request.error
        assert (request.finish, request.tokens) == ("length", 400)
        assert request.versions[0] == "0" and request.versions[-1] == "1"
        assert published_at < request.done_at
        assert publisher.publication_event(1, step=0).paused == {"run:pool-0": 1}
