"""`EnginePublisher` on in-memory weight sinks: each method reaches every engine with the
published version, a refusing engine stops the publication and is named, and the broadcast group
(a real gloo group in this process) is kept across publications and left on close."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gyre_proxy.engines import WeightUpdateFailed
from gyre_train import PublicationError
from gyre_train.cells import EnginePublisher, EnginePublisherConfig, InMemoryWeightSink


class Weights:
    """A `PublishableModel` of two named tensors drawn from `seed`."""

    def __init__(self, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.tensors = {"w": torch.randn(3, 2, generator=generator), "steps": torch.arange(4)}

    def named_tensors(self) -> dict[str, torch.Tensor]:
        return dict(self.tensors)

    def save(self, path: Path) -> Path:
        path.mkdir(parents=True)
        torch.save(self.tensors, path / "weights.pt")
        return path


def _assert_served(sink: InMemoryWeightSink, published: dict[int, Weights]) -> None:
    assert [version for version, _ in sink.served] == list(published)
    for (_, tensors), weights in zip(sink.served, published.values(), strict=True):
        assert isinstance(tensors, dict) and tensors.keys() == weights.tensors.keys()
        for name, tensor in weights.tensors.items():
            torch.testing.assert_close(tensors[name], tensor, rtol=0, atol=0)


def test_disk_saves_a_folder_per_version_that_every_engine_loads(tmp_path: Path) -> None:
    sinks = [InMemoryWeightSink("a"), InMemoryWeightSink("b")]
    with EnginePublisher(EnginePublisherConfig(("a", "b"), "disk", tmp_path), sinks) as publisher:
        for version in (1, 2):
            publisher.publish(Weights(version), version)
    folders = [(1, tmp_path / "policy-v1"), (2, tmp_path / "policy-v2")]
    assert all(sink.served == folders for sink in sinks)
    assert all((folder / "weights.pt").is_file() for _, folder in folders)


def test_tensor_sends_the_named_tensors_to_every_engine() -> None:
    sinks = [InMemoryWeightSink("a"), InMemoryWeightSink("b")]
    published = {3: Weights(3), 4: Weights(4)}
    with EnginePublisher(EnginePublisherConfig(("a", "b"), "tensor"), sinks) as publisher:
        for version, weights in published.items():
            publisher.publish(weights, version)
    for sink in sinks:
        _assert_served(sink, published)


def test_the_first_engine_that_refuses_stops_the_publication_and_is_named() -> None:
    refusing = InMemoryWeightSink("http://b", refuse=WeightUpdateFailed("busy"))
    sinks = [InMemoryWeightSink("http://a"), refusing, InMemoryWeightSink("http://c")]
    publisher = EnginePublisher(EnginePublisherConfig(("a", "b", "c"), "tensor"), sinks)
    with pytest.raises(PublicationError, match=r"http://b: .*busy"):
        publisher.publish(Weights(0), 1)
    assert [len(sink.served) for sink in sinks] == [1, 0, 0]


def test_distributed_broadcasts_to_every_engine_and_leaves_the_group_on_close() -> None:
    sinks = [InMemoryWeightSink("a"), InMemoryWeightSink("b")]
    published = {1: Weights(1), 2: Weights(2)}
    config = EnginePublisherConfig(("a", "b"), "distributed", timeout_s=30)
    with EnginePublisher(config, sinks) as publisher:
        for version, weights in published.items():
            publisher.publish(weights, version)
            assert [len(sink.groups) for sink in sinks] == [1, 1]  # one group, kept
    assert [sink.groups for sink in sinks] == [{}, {}]
    for sink in sinks:
        _assert_served(sink, published)


def test_refuses_configurations_it_cannot_publish_with(tmp_path: Path) -> None:
    with pytest.raises(PublicationError, match="one of disk, tensor, distributed"):
        EnginePublisher(EnginePublisherConfig(("a",), "nccl"), [InMemoryWeightSink()])
    with pytest.raises(PublicationError, match="needs a workdir"):
        EnginePublisher(EnginePublisherConfig(("a",), "disk"), [InMemoryWeightSink()])
    with pytest.raises(PublicationError, match="at least one engine"):
        EnginePublisher(EnginePublisherConfig((), "tensor"))
    with pytest.raises(PublicationError, match="engine_tp_size"):
        EnginePublisher(EnginePublisherConfig(("a",), "tensor", engine_tp_size=0), [InMemoryWeightSink()])
