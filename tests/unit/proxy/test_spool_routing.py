"""The record spool's failure handling and the router's failover choice."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from gyre_proxy.answer import Router
from gyre_proxy.engines.testing import FakeEngine
from gyre_proxy.ingest import RecordSpool
from gyre_store import ExecutionStarted, MalformedEvent, NewEvent, StoreBusy
from gyre_store.log import AppendResult


class FlakyRecorder:
    """Fails the first ``failures`` writes as a read-only server does (just after a failover),
    refuses records marked bad for good."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.written: list[str] = []
        self.forgotten: list[str] = []

    def write(self, records: Sequence[NewEvent]) -> list[AppendResult]:
        if self.failures:
            self.failures -= 1
            raise StoreBusy("cannot execute INSERT in a read-only transaction")
        if any(getattr(r.event, "engine", "") == "bad" for r in records):
            raise MalformedEvent("refused")
        self.written += [getattr(r.event, "execution_id", r.event.event_type) for r in records]
        return [AppendResult(i + 1, 1, False) for i in range(len(records))]

    def forget(self, execution_id: str) -> None:
        self.forgotten.append(execution_id)


def record(ex: str, engine: str = "e") -> NewEvent:
    return NewEvent(ExecutionStarted(execution_id=ex, run_id="r", engine=engine))


def test_store_errors_are_retried_until_the_records_are_written() -> None:
    recorder = FlakyRecorder(failures=3)
    spool = RecordSpool(recorder, max_backoff_s=0.01)  # type: ignore[arg-type]
    for ex in ("a", "b", "c"):
        spool.submit(record(ex))
    assert spool.flush(10)
    spool.close()
    assert recorder.written == ["a", "b", "c"] and spool.retries == 3 and spool.quarantined == 0


def test_a_refused_record_is_set_aside_alone_and_its_execution_forgotten() -> None:
    recorder = FlakyRecorder(failures=0)
    spool = RecordSpool(recorder, linger_s=0.2)  # type: ignore[arg-type]
    for r in (record("a"), record("b", engine="bad"), record("c")):
        spool.submit(r)
    assert spool.flush(10)
    spool.close()
    # Without a spool folder there is no dead-letter file: the refused record is counted lost,
    # and the note saying so is written after the others.
    assert recorder.written == ["a", "c", "record.quarantined"]
    assert spool.lost == 1 and spool.quarantined == 0 and recorder.forgotten == ["b"]


def test_a_failed_engine_never_leaves_an_execution_without_a_choice() -> None:
    router = Router([("only", FakeEngine())])  # type: ignore[list-item]
    assert router.engine_for("ex").name == "only"
    router.mark_failed("only", "ex")  # nowhere else to go: must not raise
    assert router.engine_for("ex").name == "only"
    two = Router([("a", FakeEngine()), ("b", FakeEngine())])  # type: ignore[list-item]
    first = two.engine_for("ex").name
    two.set_accepting(first, False)
    assert two.engine_for("ex").name != first


def test_an_engine_that_failed_is_passed_over_by_every_execution_until_it_registers_again() -> None:
    now = [0.0]
    router = Router([("a", FakeEngine()), ("b", FakeEngine())], clock=lambda: now[0])  # type: ignore[list-item]
    assert [router.engine_for(e).name for e in ("x", "y")] == ["a", "b"]
    router.mark_failed("a", "x")  # a died under x's request
    # x's retry, and a new execution that would balance onto a, both go to b
    assert router.engine_for("x").name == "b"
    assert router.engine_for("z").name == "b"
    now[0] = 11.0  # after the pause, a is chosen again by load
    assert router.engine_for("w").name == "a"
    router.mark_failed("a", "w")
    router.add("a", FakeEngine())  # type: ignore[arg-type]  # restarted and registered: chosen at once
    assert router.engine_for("w").name == "a"


def test_a_rerouted_execution_is_reported_moved_once_its_new_route_holds() -> None:
    from gyre_proxy.answer import Binding
    from gyre_store import ExecutionRerouted, InMemoryEventLog

    router = Router()
    router.add("run:cell-1", FakeEngine(), run_id="run", slot="cell-1")  # type: ignore[arg-type]
    router.add("run:pool-0", FakeEngine(), run_id="run", slot="pool")  # type: ignore[arg-type]
    moved: list[tuple[str, str]] = []
    # The listener sees the new route already in place (the pipeline retries through it).
    router.on_moved(lambda ex: moved.append((ex, router.engine_for(ex).name)))
    router.bind("x", Binding("run", "cell-1"))
    router.bind("idle", Binding("run", "cell-1"))
    assert router.engine_for("x").name == "run:cell-1"
    router.bind("x", Binding("run", "cell-1"))  # the same binding again: nothing moves
    router.bind("idle", Binding("run", "pool"))  # never served yet: nothing in flight to move
    assert moved == []
    log = InMemoryEventLog()  # the scheduler's reroute, as the proxy's follower reads it
    log.append([NewEvent(ExecutionRerouted(execution_id="x", run_id="run", engine="pool"))])
    [recorded] = log.read(0)
    router.apply(recorded)
    assert moved == [("x", "run:pool-0")]
    assert router.engine_for("idle").name == "run:pool-0"


def test_a_failed_engine_of_its_slot_does_not_keep_an_execution_from_a_healthy_one() -> None:
    from gyre_proxy.answer import Binding

    router = Router(clock=lambda: 0.0)
    router.add("run:cell-0", FakeEngine(), run_id="run", slot="cell-0")  # type: ignore[arg-type]
    router.add("run:pool-0", FakeEngine(), run_id="run", slot="pool")  # type: ignore[arg-type]
    router.bind("x", Binding("run", "cell-0"))
    assert router.engine_for("x").name == "run:cell-0"
    router.mark_failed("run:cell-0", "x")  # the cell's process died under x's request
    # Its retry goes to the run's healthy engine, not back to the dead one of its slot.
    assert router.engine_for("x").name == "run:pool-0"
    assert router.engine_for("y").name == "run:pool-0"  # a newcomer too


def test_an_execution_pinned_to_one_engine_goes_there_and_nowhere_else() -> None:
    from gyre_proxy.answer import Binding
    from gyre_proxy.exceptions import EngineUnavailable

    router = Router()
    router.add("run:pool-0", FakeEngine(), run_id="run", slot="pool")  # type: ignore[arg-type]
    router.add("run:ext-big", FakeEngine(), run_id="run", slot="pool")  # type: ignore[arg-type]
    router.add("other:ext-big", FakeEngine(), run_id="other", slot="pool")  # type: ignore[arg-type]
    for i in range(3):  # the least loaded engine would be the other one of the pool
        router.engine_for(f"busy-{i}")
    router.bind("judge", Binding.of("run~judge", "engine:run:ext-big"))
    assert router.engine_for("judge").name == "run:ext-big"
    router.set_accepting("run:ext-big", False)
    # Not moved to another engine of the run (a pinned call is that engine's or fails).
    with pytest.raises(EngineUnavailable, match="engine 'run:ext-big' of run 'run' is not accepting"):
        router.engine_for("judge")
    router.bind("late", Binding.of("run~judge", "engine:run:ext-none"))
    with pytest.raises(EngineUnavailable, match="'run:ext-none'"):
        router.engine_for("late")
