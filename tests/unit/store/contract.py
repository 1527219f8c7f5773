"""The event-log contract: one suite, run against every EventLog implementation.

Subclasses provide a ``log`` fixture (and ``make_log`` for a second handle on the same
storage, where the implementation has one).
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import msgspec
import numpy as np
import pytest

from gyre_store import (
    EventLog,
    ExecutionDispatched,
    ExecutionFinished,
    ExecutionStarted,
    FinishReason,
    MalformedEvent,
    NewEvent,
    Payload,
    PayloadTooLarge,
    StreamId,
    StreamVersionConflict,
    UnknownEventType,
    iterate,
    read_to_head,
    subscribe,
)
from gyre_store.log import Event, RecordedEvent


def dispatched(eid: str, run: str = "r1", group: str = "g1") -> ExecutionDispatched:
    return ExecutionDispatched(execution_id=eid, run_id=run, group_id=group, policy_version=0)


def started(eid: str, run: str = "r1") -> ExecutionStarted:
    return ExecutionStarted(execution_id=eid, run_id=run, engine="engine-0")


class Unregistered(Event, frozen=True, kw_only=True):
    x: int


class EventLogContract:
    """Behaviour every EventLog must have."""

    def test_append_then_read_round_trips_body_payload_and_metadata(self, log: EventLog) -> None:
        ids = np.arange(2048, dtype=np.int32)
        logprobs = np.linspace(-5, 0, 2048, dtype=np.float32)
        logprobs[3] = np.nan
        [res] = log.append([NewEvent(dispatched("e1"), payload=Payload(input_ids=ids, logprobs=logprobs))])
        assert (res.position, res.stream_version, res.duplicate) == (1, 1, False)
        [ev] = log.read(0)
        assert ev.event == dispatched("e1")
        assert ev.stream == StreamId("execution", "e1")
        assert ev.event_type == "execution.dispatched"
        assert ev.payload is not None
        assert ev.payload["input_ids"].dtype == np.int32
        np.testing.assert_array_equal(ev.payload["input_ids"], ids)
        np.testing.assert_array_equal(ev.payload["logprobs"], logprobs)
        assert ev.metadata.run_id == "r1"  # taken from the event body

    @pytest.mark.parametrize("size", [3, 80])
    def test_batch_positions_are_gapless_and_versions_per_stream(self, log: EventLog, size: int) -> None:
        batch = [NewEvent(dispatched(f"e{i % 5}") if i < 5 else started(f"e{i % 5}")) for i in range(size)]
        results = log.append(batch)
        assert [r.position for r in results] == list(range(1, size + 1))
        per_stream: dict[str, int] = {}
        for i, r in enumerate(results):
            key = f"e{i % 5}"
            per_stream[key] = per_stream.get(key, 0) + 1
            assert r.stream_version == per_stream[key]
        assert log.head() == size
        assert [e.position for e in iterate(log, batch=7)] == list(range(1, size + 1))

    @pytest.mark.parametrize("size", [3, 80])
    def test_conflict_anywhere_in_a_batch_writes_nothing(self, log: EventLog, size: int) -> None:
        log.append([NewEvent(dispatched("taken"))])
        batch = [NewEvent(dispatched(f"new{i}")) for i in range(size - 1)]
        batch.insert(size // 2, NewEvent(started("taken"), expected_version=0))
        with pytest.raises(StreamVersionConflict) as info:
            log.append(batch)
        assert (info.value.expected, info.value.actual) == (0, 1)
        assert log.head() == 1
        assert [e.position for e in log.read(0)] == [1]

    def test_expected_versions_are_checked_in_sequence_within_a_batch(self, log: EventLog) -> None:
        results = log.append(
            [
                NewEvent(dispatched("e"), expected_version=0),
                NewEvent(started("e"), expected_version=1),
                NewEvent(
                    ExecutionFinished(execution_id="e", run_id="r1", reason=FinishReason.COMPLETED),
                    expected_version=2,
                ),
            ]
        )
        assert [r.stream_version for r in results] == [1, 2, 3]
        with pytest.raises(StreamVersionConflict):
            log.append([NewEvent(started("e"), expected_version=2)])

    @pytest.mark.parametrize("size", [1, 40])
    def test_idempotency_key_repeat_is_a_no_op_returning_the_original(self, log: EventLog, size: int) -> None:
        first = log.append([NewEvent(dispatched(f"e{i}"), idempotency_key=f"k{i}") for i in range(size)])
        again = log.append([NewEvent(dispatched(f"e{i}"), idempotency_key=f"k{i}") for i in range(size)])
        assert [r.position for r in again] == [r.position for r in first]
        assert all(r.duplicate for r in again) and not any(r.duplicate for r in first)
        assert log.head() == size

    def test_duplicate_key_inside_one_batch_lands_once(self, log: EventLog) -> None:
        results = log.append(
            [
                NewEvent(dispatched("a"), idempotency_key="same"),
                NewEvent(started("a"), idempotency_key="same"),
            ]
        )
        assert results[1].duplicate and results[1].position == results[0].position
        assert log.head() == 1

    def test_retried_batch_with_expected_versions_is_still_a_no_op(self, log: EventLog) -> None:
        batch = [NewEvent(dispatched("e"), expected_version=0, idempotency_key="d-e")]
        log.append(batch)
        # A writer that lost the acknowledgement sends the same batch again.
        [res] = log.append(batch)
        assert res.duplicate and res.position == 1

    def test_read_filters_by_until_types_and_limit(self, log: EventLog) -> None:
        log.append(
            [NewEvent(dispatched(f"e{i}")) for i in range(6)] + [NewEvent(started(f"e{i}")) for i in range(6)]
        )
        assert [e.position for e in log.read(0, until=4)] == [1, 2, 3, 4]
        assert [e.position for e in log.read(2, limit=3)] == [3, 4, 5]
        assert [e.position for e in log.read(0, types=["execution.started"])] == list(range(7, 13))
        assert [e.position for e in log.read(8, types=["execution.started"], until=10)] == [9, 10]

    def test_read_stream_in_version_order(self, log: EventLog) -> None:
        log.append([NewEvent(dispatched("a")), NewEvent(dispatched("b")), NewEvent(started("a"))])
        stream = log.read_stream(StreamId("execution", "a"))
        assert [(e.stream_version, e.position) for e in stream] == [(1, 1), (2, 3)]
        assert [e.stream_version for e in log.read_stream(StreamId("execution", "a"), after_version=1)] == [2]
        assert log.read_stream(StreamId("execution", "nope")) == []

    def test_malformed_unknown_and_oversize_events_are_rejected_and_nothing_changes(
        self, log: EventLog
    ) -> None:
        log.append([NewEvent(dispatched("kept"))])
        bad_type = ExecutionDispatched(execution_id="x", run_id="r1", group_id="g", policy_version="zero")  # type: ignore[arg-type]
        with pytest.raises(MalformedEvent, match="policy_version"):
            log.append([NewEvent(dispatched("ok")), NewEvent(bad_type)])
        with pytest.raises(MalformedEvent):
            log.append(
                [NewEvent(ExecutionDispatched(execution_id="", run_id="r1", group_id="g", policy_version=0))]
            )
        with pytest.raises(UnknownEventType):
            log.append([NewEvent(Unregistered(x=1))])
        with pytest.raises(UnknownEventType):
            log.registry.from_dict("no.such.type", {})
        with pytest.raises(MalformedEvent, match="reason"):
            log.registry.from_dict(
                "execution.finished", {"execution_id": "e", "run_id": "r", "reason": "bored"}
            )
        huge = Payload(ids=np.zeros((70 << 20) // 4, dtype=np.int32))
        with pytest.raises(PayloadTooLarge, match="limit"):
            log.append([NewEvent(dispatched("big"), payload=huge)])
        assert log.head() == 1
        assert [e.event for e in log.read(0)] == [dispatched("kept")]

    def test_wait_wakes_on_append_and_times_out_otherwise(self, log: EventLog) -> None:
        assert log.wait(0, timeout=0.05) is False
        timer = threading.Timer(0.2, lambda: log.append([NewEvent(dispatched("late"))]))
        timer.start()
        began = time.monotonic()
        assert log.wait(0, timeout=10) is True
        assert time.monotonic() - began < 9
        timer.join()

    def test_subscription_resumes_from_its_checkpoint(self, log: EventLog) -> None:
        log.append([NewEvent(dispatched(f"e{i}")) for i in range(5)])
        seen: list[int] = []
        for batch in subscribe(log, 0, batch=2, poll_s=0.05, stop_after_idle_s=0.1):
            seen.extend(e.position for e in batch)
        assert seen == [1, 2, 3, 4, 5]
        log.append([NewEvent(started(f"e{i}")) for i in range(3)])
        resumed = [
            e.position for b in subscribe(log, seen[-1], poll_s=0.05, stop_after_idle_s=0.1) for e in b
        ]
        assert resumed == [6, 7, 8]

    def test_filtered_subscription_skips_unrelated_events(self, log: EventLog) -> None:
        log.append([NewEvent(dispatched(f"e{i}")) for i in range(4)] + [NewEvent(started("e0"))])
        got = [
            e.position
            for b in subscribe(log, 0, types=["execution.started"], poll_s=0.05, stop_after_idle_s=0.1)
            for e in b
        ]
        assert got == [5]

    def test_read_to_head_returns_matching_events_and_a_cursor_past_unrelated_ones(
        self, log: EventLog
    ) -> None:
        log.append([NewEvent(started("e0"))] + [NewEvent(dispatched(f"e{i}")) for i in range(3)])
        events, cursor = read_to_head(log, 0, types=["execution.started"])
        assert [e.position for e in events] == [1] and cursor == 4  # past the unrelated tail
        log.append([NewEvent(started("e1"))])
        events, cursor = read_to_head(log, cursor, types=["execution.started"])
        assert [e.position for e in events] == [5] and cursor == 5
        assert read_to_head(log, cursor) == ([], 5)

    def test_a_spaced_subscription_reads_at_most_once_per_interval(self, log: EventLog) -> None:
        reads: list[float] = []
        original = log.read

        subscriber = threading.current_thread()

        def counting_read(*args: Any, **kwargs: Any) -> list[RecordedEvent]:
            if threading.current_thread() is subscriber:  # not the writer's own reads
                reads.append(time.monotonic())
            return original(*args, **kwargs)

        def writer() -> None:
            for i in range(20):  # an append every 10 ms for 200 ms
                log.append([NewEvent(dispatched(f"w{i}"))])
                time.sleep(0.01)

        thread = threading.Thread(target=writer)
        log.read = counting_read  # type: ignore[method-assign]
        try:
            thread.start()
            got = [
                e.position
                for b in subscribe(log, 0, poll_s=0.05, stop_after_idle_s=0.3, min_interval_s=0.1)
                for e in b
            ]
        finally:
            thread.join()
            del log.read
        assert got == list(range(1, 21))  # nothing lost
        gaps = [round(b - a, 4) for a, b in itertools.pairwise(reads)]
        assert min(gaps) >= 0.05, gaps  # ~0.1 s; unspaced, every 10 ms append would wake a read
        # At most one read per 100 ms over the time the reads spanned (20 appends and 300 ms idle
        # take about 0.5 s on a quiet machine, longer on a loaded one): unspaced, each append
        # would have woken a read of its own.
        assert len(reads) <= (reads[-1] - reads[0]) / 0.1 + 2, (len(reads), reads[-1] - reads[0])

    def test_bodies_are_stored_as_plain_json(self, log: EventLog) -> None:
        log.append([NewEvent(dispatched("e1"))])
        [ev] = log.read(0)
        assert msgspec.json.decode(msgspec.json.encode(ev.event)) == {
            "execution_id": "e1",
            "run_id": "r1",
            "group_id": "g1",
            "policy_version": 0,
        }
