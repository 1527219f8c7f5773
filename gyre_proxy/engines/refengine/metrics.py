"""The reference engine's Prometheus metrics, served at ``GET /metrics`` beside SGLang's API.

Read from the engine when scraped, so decoding pays nothing for them but one integer
increment per generated token. Only what this engine knows: tokens generated, requests waiting
and decoding, the tokens whose KV the decoding requests hold (each request has its own cache:
there is no fixed pool, so no fraction of one), and the caches kept for KV migration against
their bounds. SGLang servers export their own with ``--enable-metrics``.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gyre_proxy.engines.refengine.engine import ReferenceEngine

CONTENT_TYPE = CONTENT_TYPE_LATEST

METRIC_NAMES = (
    "gyre_engine_generated_tokens_total",
    "gyre_engine_requests_waiting",
    "gyre_engine_requests_running",
    "gyre_engine_kv_tokens",
    "gyre_engine_kv_pinned_bytes",
    "gyre_engine_kv_pinned_max_bytes",
    "gyre_engine_kv_imported_bytes",
    "gyre_engine_kv_imported_max_bytes",
    "gyre_engine_accepting",
)


class EngineCollector(Collector):
    """The figures of one ``ReferenceEngine``, read at each scrape."""

    def __init__(self, engine: ReferenceEngine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        loop = self.engine.loop
        load = loop.load()
        _, pinned_bytes = loop.pinned.totals()  # (entries, bytes); the entries are in /gyre/kv/status
        _, imported_bytes = loop.prefixes.totals()
        yield CounterMetricFamily(
            "gyre_engine_generated_tokens",
            "Tokens the engine generated (sampled or scripted) since it started.",
            value=loop.generated_tokens,
        )
        yield GaugeMetricFamily(
            "gyre_engine_requests_waiting", "Requests submitted and not yet decoding.", value=load.waiting
        )
        yield GaugeMetricFamily(
            "gyre_engine_requests_running", "Requests prefilling or decoding.", value=load.running
        )
        yield GaugeMetricFamily(
            "gyre_engine_kv_tokens",
            "Token positions whose KV cache the running requests hold.",
            value=load.kv_tokens,
        )
        yield GaugeMetricFamily(
            "gyre_engine_kv_pinned_bytes",
            "Bytes of KV caches pinned for migration to another engine.",
            value=pinned_bytes,
        )
        yield GaugeMetricFamily(
            "gyre_engine_kv_pinned_max_bytes",
            "The bound on pinned KV caches, in bytes.",
            value=loop.pinned.limits.max_bytes,
        )
        yield GaugeMetricFamily(
            "gyre_engine_kv_imported_bytes",
            "Bytes of KV caches imported from other engines, kept as a prefix cache.",
            value=imported_bytes,
        )
        yield GaugeMetricFamily(
            "gyre_engine_kv_imported_max_bytes",
            "The bound on imported KV caches, in bytes.",
            value=loop.prefixes.limits.max_bytes,
        )
        yield GaugeMetricFamily(
            "gyre_engine_accepting",
            "1 while the engine accepts new requests, 0 while it drains for a role transition.",
            value=1 if self.engine.accepting else 0,
        )


def engine_registry(engine: ReferenceEngine) -> CollectorRegistry:
    """A registry holding ``engine``'s metrics (one per served app: no process-wide state)."""
    registry = CollectorRegistry()
    registry.register(EngineCollector(engine))
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    """``registry`` in Prometheus's text format."""
    return generate_latest(registry)
