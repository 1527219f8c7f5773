"""The controller's metrics server: scraped over HTTP after a driven run (transitions both
ways), every figure equals the decision core's state and the decisions recorded."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from gyre_sched import BeginTransition, CellRole, Direction
from gyre_sched.live import Controller, MetricsServer, load_run
from gyre_store import InMemoryEventLog
from tests.unit.sched.helpers import tiny
from tests.unit.sched.test_controller import RUN, drive


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_scraped_figures_equal_the_decision_core() -> None:
    driven = drive(InMemoryEventLog(), tiny())
    # A controller started again on the log: its figures are the run's, replayed.
    controller = Controller(driven.log, tiny(), driven.world, RUN)
    state = controller.state()
    begins = [
        d for e in load_run(driven.log, RUN).entries for d in e.decisions if isinstance(d, BeginTransition)
    ]
    assert {d.direction for d in begins} == set(Direction)  # the figures below can tell the two apart
    with MetricsServer(controller, port=0) as server:
        assert server.port != 0
        got = scrape(server.url)
    c = state.counters
    assert got[("gyre_controller_dispatched_total", ())] == c.d > 0
    assert got[("gyre_controller_started_total", ())] == c.p
    assert got[("gyre_controller_finished_total", ())] == c.f
    assert got[("gyre_controller_waterlevel", ())] == c.d - c.f
    assert got[("gyre_controller_queued", ())] == c.d - c.p
    assert got[("gyre_controller_running", ())] == c.p - c.f
    assert got[("gyre_controller_rollout_capacity", ())] == state.rollout_capacity
    assert got[("gyre_controller_training_cells", ())] == state.training_cells
    assert got[("gyre_controller_policy_version", ())] == state.version
    assert got[("gyre_controller_inputs_total", ())] == controller.inputs_recorded
    for role in CellRole:
        assert got[("gyre_controller_cells", (("role", role.value),))] == sum(r is role for r in state.roles)
    assert sum(got[("gyre_controller_cells", (("role", r.value),))] for r in CellRole) == tiny().cells
    for direction in Direction:
        expected = sum(d.direction is direction for d in begins)
        assert got[("gyre_controller_transitions_total", (("direction", direction.value),))] == expected
