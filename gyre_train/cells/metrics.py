"""A trainer cell's Prometheus metrics: micro-steps claimed and computed, forward-backward seconds,
optimizer updates, joins and publications.

``CellMetrics`` is fed the events the cell records (``Cell.record`` hands it each one before it
is appended), so what is scraped is what the run's log says of the cell: a micro-step's seconds
are the ``train.micro_step_computed`` seconds, a publication's are the ``policy.published``
save and send seconds. A cell without a database still counts. ``CellMetrics.serve`` exposes
the figures at ``http://host:port/metrics`` (prometheus_client's server, a thread of the cell's
leader process), for ``gyre node serve --cell-metrics-port``.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Self

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from gyre_store import (
    CellJoinedBatch,
    Event,
    MicroStepClaimed,
    MicroStepComputed,
    TrainingUpdate,
    WeightsPublished,
)

METRIC_NAMES = (
    "gyre_trainer_claims_total",
    "gyre_trainer_micro_step_seconds",
    "gyre_trainer_tokens_total",
    "gyre_trainer_joins_total",
    "gyre_trainer_updates_total",
    "gyre_trainer_loss",
    "gyre_trainer_grad_norm",
    "gyre_trainer_policy_version",
    "gyre_trainer_publications_total",
    "gyre_trainer_publish_seconds",
)

_PASSES = {1: "ratios", 2: "gradient"}  # Phase values: pass 1's forward, pass 2's forward-backward
_STEP_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_PUBLISH_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class CellMetrics:
    """The metrics of trainer cell ``cell`` (label ``cell`` on every series), in a registry of
    their own."""

    def __init__(self, cell: int) -> None:
        self.cell = str(cell)
        self.registry = CollectorRegistry()
        r = self.registry
        self.claims = Counter(
            "gyre_trainer_claims",
            "Micro-step tasks this cell claimed, by pass.",
            ["cell", "pass"],
            registry=r,
        )
        self.step_seconds = Histogram(
            "gyre_trainer_micro_step_seconds",
            "Seconds inside the model per claimed task: pass 1's forward, pass 2's forward-backward.",
            ["cell", "pass"],
            buckets=_STEP_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(
            "gyre_trainer_tokens",
            "Tokens of the micro-steps this cell computed, by pass.",
            ["cell", "pass"],
            registry=r,
        )
        self.joins = Counter(
            "gyre_trainer_joins", "Batches in flight this cell joined (satellites).", ["cell"], registry=r
        )
        self.updates = Counter(
            "gyre_trainer_updates", "Optimizer updates this cell applied (the core).", ["cell"], registry=r
        )
        self.loss = Gauge("gyre_trainer_loss", "The loss of the last update.", ["cell"], registry=r)
        self.grad_norm = Gauge(
            "gyre_trainer_grad_norm", "The gradient norm of the last update.", ["cell"], registry=r
        )
        self.version = Gauge(
            "gyre_trainer_policy_version",
            "The policy version this cell last joined or produced.",
            ["cell"],
            registry=r,
        )
        self.publications = Counter(
            "gyre_trainer_publications", "Policies this cell published to the engines.", ["cell"], registry=r
        )
        self.publish_seconds = Histogram(
            "gyre_trainer_publish_seconds",
            "Seconds of a publication, by part: saving the policy, sending it to every engine at once.",
            ["cell", "part"],
            buckets=_PUBLISH_BUCKETS,
            registry=r,
        )
        self._server: Any = None
        self._thread: Any = None

    def observe(self, event: Event) -> None:
        """Count one event the cell records (others are ignored)."""
        cell = self.cell
        if isinstance(event, MicroStepClaimed):
            self.claims.labels(cell, _PASSES.get(event.phase, str(event.phase))).inc()
        elif isinstance(event, MicroStepComputed):
            name = _PASSES.get(event.phase, str(event.phase))
            self.step_seconds.labels(cell, name).observe(event.seconds)
            self.tokens.labels(cell, name).inc(event.tokens)
        elif isinstance(event, CellJoinedBatch):
            self.joins.labels(cell).inc()
            self.version.labels(cell).set(event.policy_version)
        elif isinstance(event, TrainingUpdate):
            self.updates.labels(cell).inc()
            self.loss.labels(cell).set(event.loss)
            self.grad_norm.labels(cell).set(event.grad_norm)
            self.version.labels(cell).set(event.policy_version)
        elif isinstance(event, WeightsPublished):
            self.publications.labels(cell).inc()
            if event.method:  # a publication the core measured (policy.published v2)
                self.publish_seconds.labels(cell, "save").observe(event.save_s)
                self.publish_seconds.labels(cell, "send").observe(event.send_s)

    # -- serving --------------------------------------------------------------------------------

    def serve(self, *, host: str = "127.0.0.1", port: int = 0) -> Self:
        """Serve the metrics at ``http://host:port/metrics`` (port 0: a free one) from a thread."""
        self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        self.host, self.port = host, int(self._server.server_port)
        return self

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
