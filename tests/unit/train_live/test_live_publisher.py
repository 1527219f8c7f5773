"""`LivePublisher` on in-memory engines: every registered engine gets each publication at once
(concurrently, not one after another), by the run's method, with the published version; an
unreachable engine is skipped and named, a refusing one fails the publication once all have
answered; engines that can pause generation are paused before the send and continued after
(even when the send failed), and each publication's figures (seconds, engines reached and
skipped, requests paused) go into its policy.published event and publications.jsonl."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from gyre_proxy.engines import EngineUnavailable, WeightUpdateFailed
from gyre_proxy.engines.weights import BroadcastGroup
from gyre_store import EngineRegistered, InMemoryEventLog, NewEvent, WeightsPublished
from gyre_train import PublicationError
from gyre_train.cells import InMemoryWeightSink, LivePublisher, LiveTraining
from gyre_train.cells.live import PUBLICATIONS_FILE
from gyre_train.exceptions import InvalidConfigError
from gyre_train.trajectories import PackingConfig


class Weights:
    """A `PublishableModel` of one tensor drawn from `seed`."""

    def __init__(self, seed: int) -> None:
        self.tensors = {"w": torch.randn(3, 2, generator=torch.Generator().manual_seed(seed))}

    def named_tensors(self) -> dict[str, torch.Tensor]:
        return dict(self.tensors)

    def save(self, path: Path) -> Path:
        path.mkdir(parents=True)
        torch.save(self.tensors, path / "weights.pt")
        (path / "config.json").write_text("{}")
        return path


@dataclass
class SlowSink(InMemoryWeightSink):
    """An engine that takes `delay_s` per load and counts how many loads overlap."""

    delay_s: float = 0.2
    overlap: list[int] = field(default_factory=list)
    running: list[int] = field(default_factory=lambda: [0])  # shared between sinks by the test

    async def _slow(self) -> None:
        self.running[0] += 1
        self.overlap.append(self.running[0])
        await asyncio.sleep(self.delay_s)
        self.running[0] -= 1

    async def load_from_disk(self, path: Path, policy_version: int) -> None:
        await self._slow()
        await super().load_from_disk(path, policy_version)

    async def load_tensors(self, tensors: Mapping[str, torch.Tensor], policy_version: int) -> None:
        await self._slow()
        await super().load_tensors(tensors, policy_version)


def _log(*urls: str) -> InMemoryEventLog:
    log = InMemoryEventLog()
    log.append(
        [
            NewEvent(EngineRegistered(engine=f"run:pool-{i}", run_id="run", url=url, capacity=4))
            for i, url in enumerate(urls)
        ]
    )
    return log


@pytest.mark.parametrize("method", ["disk", "tensor"])
def test_every_engine_gets_each_publication_at_once(tmp_path: Path, method: str) -> None:
    running = [0]
    sinks = {url: SlowSink(url, running=running) for url in ("a", "b", "c")}
    publisher = LivePublisher(_log(*sinks), "run", tmp_path, method=method, sink_for=sinks.__getitem__)
    for version in (1, 2):
        publisher.publish(Weights(version), version)
    for sink in sinks.values():
        assert [v for v, _ in sink.served] == [1, 2]
        if method == "disk":
            assert [p for _, p in sink.served] == [tmp_path / "policy-v1", tmp_path / "policy-v2"]
        else:
            served = sink.served[-1][1]
            assert isinstance(served, dict)
            torch.testing.assert_close(served["w"], Weights(2).tensors["w"], rtol=0, atol=0)
    # All three loads of a publication were under way together (one after another: never > 1).
    assert max(max(s.overlap) for s in sinks.values()) == 3
    # Together they took about one engine's time, not three (a generous bound: 0.2 s each).
    lines = [json.loads(line) for line in (tmp_path / PUBLICATIONS_FILE).read_text().splitlines()]
    assert [line["version"] for line in lines] == [1, 2]
    for line in lines:
        assert line["method"] == method and line["skipped"] == []
        assert sorted(line["engines"]) == ["run:pool-0", "run:pool-1", "run:pool-2"]
        assert line["send_s"] < 3 * 0.2
    # The folder is saved whatever the method: a resumed core and a restarted engine load it.
    assert (tmp_path / "policy-v2" / "weights.pt").is_file()


def test_an_unreachable_engine_is_skipped_and_a_refusing_one_fails_after_all_answered(tmp_path: Path) -> None:
    gone = InMemoryWeightSink("gone", refuse=EngineUnavailable("connection refused"))
    good = InMemoryWeightSink("good")
    sinks = {"gone": gone, "good": good}
    publisher = LivePublisher(_log("gone", "good"), "run", tmp_path, sink_for=sinks.__getitem__)
    publisher.publish(Weights(1), 1)
    assert [v for v, _ in good.served] == [1]
    assert publisher.skipped == [(1, "run:pool-0")]
    assert publisher.publications[-1].skipped == ["run:pool-0"]

    sinks["gone"] = InMemoryWeightSink("bad", refuse=WeightUpdateFailed("shape mismatch"))
    with pytest.raises(PublicationError, match=r"run:pool-0 \(gone\): shape mismatch"):
        publisher.publish(Weights(2), 2)
    assert [v for v, _ in good.served] == [1, 2]  # the other engine was not left half-way


@dataclass
class BusySink(InMemoryWeightSink):
    """An engine that cannot be reached for its first `busy` calls (slow to accept), then answers."""

    busy: int = 1
    tries: list[int] = field(default_factory=lambda: [0])

    async def load_from_disk(self, path: Path, policy_version: int) -> None:
        self.tries[0] += 1
        if self.tries[0] <= self.busy:
            raise EngineUnavailable("connect timed out")
        await super().load_from_disk(path, policy_version)


def test_an_engine_unreachable_for_a_moment_is_tried_again_before_it_is_skipped(tmp_path: Path) -> None:
    busy, gone = BusySink("busy", busy=2), BusySink("gone", busy=10)
    sinks = {"busy": busy, "gone": gone}
    publisher = LivePublisher(
        _log("busy", "gone"),
        "run",
        tmp_path,
        sink_for=sinks.__getitem__,
        unreachable_tries=3,
        retry_pause_s=0.01,
    )
    publisher.publish(Weights(1), 1)
    assert [v for v, _ in busy.served] == [1] and busy.tries == [3]  # two refusals, then served
    assert gone.tries == [3] and gone.served == []  # three tries in all, then skipped and named
    assert publisher.publications[-1].skipped == ["run:pool-1"]
    assert sorted(publisher.publications[-1].engines) == ["run:pool-0"]
    with pytest.raises(InvalidConfigError, match="unreachable_tries must be at least 1"):
        LivePublisher(_log("busy"), "run", tmp_path, unreachable_tries=0)


def test_distributed_broadcasts_to_every_engine_and_keeps_the_group_while_they_stay(tmp_path: Path) -> None:
    sinks = {url: InMemoryWeightSink(url) for url in ("a", "b")}
    publisher = LivePublisher(
        _log("a", "b"), "run", tmp_path, method="distributed", sink_for=sinks.__getitem__
    )
    try:
        for version in (1, 2):
            publisher.publish(Weights(version), version)
        for sink in sinks.values():
            assert [v for v, _ in sink.served] == [1, 2]
            assert len(sink.groups) == 1  # one group for both publications
        assert [p.note for p in publisher.publications] == ["", ""]
    finally:
        publisher.close()
    assert all(not sink.groups for sink in sinks.values())


class NoGloo(InMemoryWeightSink):
    """An engine that cannot join a broadcast group but loads a folder."""

    async def join_group(self, group: BroadcastGroup, rank_offset: int) -> None:
        raise WeightUpdateFailed("no gloo here")


def test_a_failed_broadcast_falls_back_to_the_folder_and_says_so(tmp_path: Path) -> None:
    # timeout_s: the trainer's end of the group waits that long for the engines that refused.
    refusing = InMemoryWeightSink("a", refuse=WeightUpdateFailed("no gloo here"))
    publisher = LivePublisher(
        _log("a"), "run", tmp_path, method="distributed", sink_for=lambda url: refusing, timeout_s=2.0
    )
    with pytest.raises(PublicationError, match="no gloo here"):
        publisher.publish(Weights(1), 1)  # the folder load is refused the same way
    ok = NoGloo("a")
    publisher = LivePublisher(
        _log("a"), "run", tmp_path / "2", method="distributed", sink_for=lambda _: ok, timeout_s=2.0
    )
    publisher.publish(Weights(1), 1)
    assert ok.served == [(1, tmp_path / "2" / "policy-v1")]
    assert "broadcast failed, every engine loaded the folder instead" in publisher.publications[0].note


def test_an_unknown_method_is_refused() -> None:
    with pytest.raises(InvalidConfigError, match="publish must be one of disk, tensor, distributed"):
        LiveTraining(
            steps=1,
            mu=1,
            packing=PackingConfig(token_budget=64, groups_per_batch=1, executions_per_group=1),
            publish="nccl",
        )


@dataclass
class PausingSink(InMemoryWeightSink):
    """An engine that can pause: it had `in_flight` requests when asked (None: cannot pause).
    `calls` records pause, load and resume in order (shared between sinks by the test)."""

    in_flight: int | None = 0
    calls: list[str] = field(default_factory=list)
    paused: bool = False

    async def pause(self) -> int | None:
        self.calls.append(f"pause {self.name}")
        self.paused = self.in_flight is not None
        return self.in_flight

    async def resume(self) -> None:
        self.calls.append(f"resume {self.name}")
        self.paused = False

    async def load_from_disk(self, path: Path, policy_version: int) -> None:
        self.calls.append(f"load {self.name} paused={self.paused}")
        await super().load_from_disk(path, policy_version)


def test_engines_are_paused_for_the_send_and_the_event_carries_the_figures(tmp_path: Path) -> None:
    calls: list[str] = []
    sinks = {
        "a": PausingSink("a", in_flight=3, calls=calls),
        "b": PausingSink("b", in_flight=None, calls=calls),  # cannot pause: its update waits
        "c": InMemoryWeightSink("c", refuse=EngineUnavailable("connection refused")),
    }
    publisher = LivePublisher(_log(*sinks), "run", tmp_path, sink_for=sinks.__getitem__)
    publisher.publish(Weights(1), 1)
    # every pause before any load, every resume after: a load on an engine that paused ran paused
    assert calls[:2] == ["pause a", "pause b"]
    assert sorted(calls[2:4]) == ["load a paused=True", "load b paused=False"]
    assert calls[4:] == ["resume a"]
    event = publisher.publication_event(1, step=0)
    assert isinstance(event, WeightsPublished)
    assert (event.run_id, event.policy_version, event.step, event.method) == ("run", 1, 0, "disk")
    assert event.paused == {"run:pool-0": 3}
    assert sorted(event.engines) == ["run:pool-0", "run:pool-1"] and event.skipped == ("run:pool-2",)
    assert event.started_at > 0 and event.save_s > 0 and event.send_s > 0
    line = json.loads((tmp_path / PUBLICATIONS_FILE).read_text())
    assert line["paused"] == {"run:pool-0": 3}
    # a version this publisher did not publish gets the bare event
    assert publisher.publication_event(7, step=6) == WeightsPublished(run_id="run", policy_version=7, step=6)


def test_a_paused_engine_is_continued_even_when_the_send_fails(tmp_path: Path) -> None:
    calls: list[str] = []
    sinks = {
        "a": PausingSink("a", in_flight=1, calls=calls),
        "b": PausingSink("b", in_flight=0, calls=calls, refuse=WeightUpdateFailed("shape mismatch")),
    }
    publisher = LivePublisher(_log(*sinks), "run", tmp_path, sink_for=sinks.__getitem__)
    with pytest.raises(PublicationError, match="shape mismatch"):
        publisher.publish(Weights(1), 1)
    assert sorted(c for c in calls if c.startswith("resume")) == ["resume a", "resume b"]
    assert not any(s.paused for s in sinks.values() if isinstance(s, PausingSink))


def test_without_pausing_no_engine_is_paused(tmp_path: Path) -> None:
    calls: list[str] = []
    sinks = {"a": PausingSink("a", in_flight=2, calls=calls)}
    publisher = LivePublisher(_log(*sinks), "run", tmp_path, sink_for=sinks.__getitem__, pause=False)
    publisher.publish(Weights(1), 1)
    assert calls == ["load a paused=False"]
    assert publisher.publication_event(1, step=0).paused == {}
