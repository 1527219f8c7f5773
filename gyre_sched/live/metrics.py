"""The controller's Prometheus metrics: the counters d, p, f, the waterlevel, the cells by role
and the transitions, as the decision core holds them after its last input.

``ControllerCollector`` reads ``Controller.view()`` at each scrape (nothing is counted twice:
the figures are the decision core's own, replayed from the log when a controller starts
again, so d, p, f and the transitions carry on from the run's totals). ``MetricsServer``
serves them over HTTP on a port of their own (prometheus_client's server), for
``gyre controller serve --metrics-port``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from types import TracebackType
from typing import Any, Self

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gyre_sched.decision import CellRole, Direction
from gyre_sched.live.controller import Controller

METRIC_NAMES = (
    "gyre_controller_dispatched_total",
    "gyre_controller_started_total",
    "gyre_controller_finished_total",
    "gyre_controller_waterlevel",
    "gyre_controller_queued",
    "gyre_controller_running",
    "gyre_controller_rollout_capacity",
    "gyre_controller_training_cells",
    "gyre_controller_cells",
    "gyre_controller_transitions_total",
    "gyre_controller_policy_version",
    "gyre_controller_ready_unclaimed_groups",
    "gyre_controller_inputs_total",
)


class ControllerCollector(Collector):
    """The decision core's figures, read from ``controller`` at each scrape."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller

    def collect(self) -> Iterator[Metric]:
        view = self.controller.view()
        state, counters = view.state, view.state.counters
        for name, doc, value in (
            ("gyre_controller_dispatched", "d: executions dispatched in the run.", counters.d),
            ("gyre_controller_started", "p: executions started in the run.", counters.p),
            ("gyre_controller_finished", "f: executions finished in the run.", counters.f),
            ("gyre_controller_inputs", "Inputs the decision core was fed in the run.", view.inputs),
        ):
            yield CounterMetricFamily(name, doc, value=value)
        for name, doc, value in (
            ("gyre_controller_waterlevel", "w = d - f: executions queued or running.", counters.waterlevel),
            ("gyre_controller_queued", "d - p: executions dispatched, not started.", counters.queued),
            ("gyre_controller_running", "p - f: executions started, not finished.", counters.running),
            ("gyre_controller_rollout_capacity", "C_R(t) of eq. 1.", state.rollout_capacity),
            ("gyre_controller_training_cells", "k(t): cells not in the rollout role.", state.training_cells),
            ("gyre_controller_policy_version", "The policy version dispatch samples from.", state.version),
            (
                "gyre_controller_ready_unclaimed_groups",
                "Ready groups the packing buffer has not taken.",
                state.ready_unclaimed,
            ),
        ):
            yield GaugeMetricFamily(name, doc, value=value)
        cells = GaugeMetricFamily("gyre_controller_cells", "Cells by role.", labels=["role"])
        for role in CellRole:
            cells.add_metric([role.value], sum(r is role for r in state.roles))
        yield cells
        transitions = CounterMetricFamily(
            "gyre_controller_transitions",
            "Role transitions the decision core began, by direction.",
            labels=["direction"],
        )
        for direction in Direction:
            transitions.add_metric([direction.value], view.transitions.get(direction, 0))
        yield transitions


class MetricsServer:
    """``controller``'s metrics at ``http://host:port/metrics`` (port 0: a free one), served from
    a thread while entered."""

    def __init__(self, controller: Controller, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(ControllerCollector(controller))
        self.host, self.port = host, port
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Where the metrics are served (the port bound, once entered)."""
        return f"http://{self.host}:{self.port}/metrics"

    def __enter__(self) -> Self:
        self._server, self._thread = start_http_server(self.port, addr=self.host, registry=self.registry)
        self.port = self._server.server_port
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
