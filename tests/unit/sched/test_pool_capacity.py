"""C_s from the engines that registered: the decision core takes each change as an input, the
invariant checker follows it, the controller feeds it and a replay reproduces it, and
``RegisteredPool`` sums the registered pool engines that still answer."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from gyre_proxy import ServerThread
from gyre_sched import InputOrderError, PolicyKind, StartExecutions
from gyre_sched.decision import (
    ClockTick,
    DecisionCore,
    ExecutionFinished,
    PoolCapacityChanged,
    RunStarted,
    check_log,
)
from gyre_sched.decision.codec import LogEntry
from gyre_sched.live import Controller, SchedInput, replay_run, sched_stream
from gyre_sched.live.capacity import RegisteredPool
from gyre_sched.testing import RecordingSink
from gyre_store import EngineRegistered, InMemoryEventLog, NewEvent, catalog
from gyre_tools.serve import engine_answers
from tests.unit.sched.helpers import tiny

RUN = "run-1"


def _started(decisions: tuple[object, ...]) -> int:
    return sum(len(d.placements) for d in decisions if isinstance(d, StartExecutions))


def test_more_pool_capacity_starts_queued_executions_and_less_starts_none_until_room() -> None:
    core = DecisionCore(tiny(PolicyKind.ASYNC, pool_capacity=8))  # 2 cells training, a pool of 8
    assert _started(core.handle(RunStarted(0.0))) == 8  # executions 0-7; the queue holds more
    assert core.state().counters.queued > 4
    assert _started(core.handle(PoolCapacityChanged(1.0, 12))) == 4  # executions 8-11
    assert core.rollout_capacity == 12
    assert _started(core.handle(PoolCapacityChanged(2.0, 2))) == 0  # 12 running on a pool of 2
    for execution in range(10):  # ten finish: 2 running, still no room
        assert _started(core.handle(ExecutionFinished(3.0 + execution, execution))) == 0
    assert _started(core.handle(ExecutionFinished(20.0, 10))) == 1  # one running: one starts
    with pytest.raises(InputOrderError, match="negative"):
        core.handle(PoolCapacityChanged(21.0, -1))


def test_the_invariant_checker_holds_placements_to_the_capacity_of_their_time() -> None:
    cfg = tiny(PolicyKind.ASYNC, pool_capacity=8)
    core = DecisionCore(cfg)
    log = [LogEntry(event, core.handle(event)) for event in (RunStarted(0.0), PoolCapacityChanged(1.0, 12))]
    assert check_log(cfg, log) == []
    # The same starts after a mere tick instead: four more placements on a full pool of 8.
    violations = check_log(cfg, [log[0], LogEntry(ClockTick(1.0), log[1].decisions)])
    assert {v.kind.value for v in violations} == {"over_capacity"}


def test_the_controller_feeds_capacity_changes_and_a_replay_reproduces_them() -> None:
    log = InMemoryEventLog()
    cfg = tiny(PolicyKind.ASYNC, pool_capacity=8)
    capacity: list[int | None] = [None]
    controller = Controller(
        log, cfg, RecordingSink(), RUN, clock=lambda: 0.0, pool_capacity=lambda: capacity[0]
    )
    capacity[0] = 12
    assert controller.run_once() == 0  # before the run starts nothing is fed
    started = catalog.RunStarted(
        run_id=RUN, harness="h", model="m", group_size=2, batch_groups=4, cells=2, cell_capacity=8
    )
    log.append([NewEvent(started)])
    controller.run_once()
    assert controller.state().rollout_capacity == 12
    fed = [e.event.input for e in log.read_stream(sched_stream(RUN)) if isinstance(e.event, SchedInput)]
    assert [type(i).__name__ for i in fed] == ["RunStarted", "PoolCapacityChanged"]
    assert controller.run_once() == 0  # unchanged: nothing new
    capacity[0] = 3
    assert controller.run_once() == 1
    assert replay_run(log, RUN).ok
    again = Controller(log, cfg, RecordingSink(), RUN, clock=lambda: 0.0)  # rebuilt from the log
    assert again.state().rollout_capacity == 3


def _health_server() -> ServerThread:
    app = Starlette(routes=[Route("/health", lambda request: PlainTextResponse("ok"))])
    return ServerThread(app, name="health")


def _register(
    log: InMemoryEventLog, engine: str, url: str, capacity: int, cell_index: int = -1, run_id: str = RUN
) -> None:
    event = EngineRegistered(engine=engine, run_id=run_id, url=url, cell_index=cell_index, capacity=capacity)
    log.append([NewEvent(event)])


def test_the_pool_sums_registered_engines_that_answer() -> None:
    log = InMemoryEventLog()
    now = [0.0]
    pool = RegisteredPool(log, RUN, engine_answers, lost_after_s=10.0, clock=lambda: now[0])
    try:
        with _health_server() as live:
            assert pool() is None  # nothing probed yet
            _register(log, "run-1:pool-0", live.base_url, 4)
            _register(log, "run-1:pool-1", "http://127.0.0.1:9", 8)  # nothing answers there
            _register(log, "run-1:cell-0", live.base_url, 16, cell_index=0)  # C_e: not the pool's
            _register(log, "other:pool-0", live.base_url, 32, run_id="other")  # another run's
            assert pool.probe() == 12  # pool-1 not asked long enough to be taken as lost
            now[0] = 11.0
            assert pool.probe() == 4  # pool-1 never answered: lost
            _register(log, "run-1:pool-1", live.base_url, 8)  # started again elsewhere
            assert pool.probe() == 12 and pool() == 12
        now[0] = 30.0  # the server is gone: both stop answering
        assert pool.probe() == 0
    finally:
        pool.close()
