"""Event-store benchmarks, each figure beside a baseline measured in the same run.

    .venv/bin/python benchmarks/bench_store.py [--events 100000] [--pg URL]

1. model-call-sized appends (2,048 token ids + logprobs each) through gyre_store against
   raw psycopg binary COPY of the same rows into a bare table (target: >= 50% of raw);
2. small single-event appends in autocommit, p50 latency against a raw single-row INSERT
   (target: <= 2x);
3. reading the log in commit order (target: >= 50,000 small events/s), beside a raw
   SELECT of the same rows;
4. rebuilding the counters projection over the whole log (the model calls, the single
   appends and the N small events), beside reading those same events with the rebuild's own
   reads (same query, batch and event types, without folding them), timed just before and just
   after the rebuild (their mean is the baseline). No target.

Every row ends with MET or MISSED against its target, or "no target".
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psycopg
from psycopg.types.json import Jsonb
from rich.console import Console
from rich.progress import track
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scratch import scratch_database

from gyre_store import (
    NewEvent,
    Payload,
    PostgresEventLog,
    PostgresProjectionStore,
    Projection,
    StoreConfig,
    lifecycle_projections,
    rebuild,
)
from gyre_store.catalog import ExecutionDispatched, ExecutionStarted
from gyre_store.log.queries import COPY_TYPES, EVENT_COLUMNS

console = Console(width=160)
REBUILD_BATCH = 1000  # events per read, in the rebuild and in its baseline alike

BARE = """
CREATE TABLE bare_events (
    position bigint, stream_type text, stream_id text, stream_version bigint, event_type text,
    schema_version integer, event_id uuid, idempotency_key text, body jsonb, payload bytea,
    correlation_id uuid, causation_id uuid, run_id text, policy_version bigint,
    recorded_at timestamptz DEFAULT now()
)
"""


def model_call_events(n: int, offset: int) -> list[NewEvent]:
    rng = np.random.default_rng(offset)
    ids = rng.integers(0, 151_000, size=2048, dtype=np.int32)
    lps = -rng.random(2048, dtype=np.float32)
    return [
        NewEvent(
            ExecutionStarted(execution_id=f"mc{offset + i}", run_id="bench", engine="e0"),
            payload=Payload(output_ids=ids, logprobs=lps),
        )
        for i in range(n)
    ]


def bench_bulk(log: PostgresEventLog, url: str, total: int, batch: int) -> tuple[float, float]:
    """Alternate raw and gyre_store batches so machine noise hits both sides alike."""
    from gyre_store import REGISTRY

    raw_events = [REGISTRY.encode(e) for e in model_call_events(total, 0)]  # raw gets pre-encoded rows
    ours_events = model_call_events(total, total)
    raw_s = ours_s = 0.0
    pos = 0
    with psycopg.connect(url, autocommit=True) as conn:
        for i in track(
            range(0, total, batch), description="bulk append (raw COPY vs gyre_store)", console=console
        ):
            began = time.perf_counter()
            with (
                conn.transaction(),
                conn.cursor() as cur,
                cur.copy(f"COPY bare_events ({', '.join(EVENT_COLUMNS)}) FROM STDIN (FORMAT BINARY)") as copy,
            ):
                copy.set_types(list(COPY_TYPES))
                for e in raw_events[i : i + batch]:
                    pos += 1
                    copy.write_row(
                        (
                            pos,
                            e.stream.type,
                            e.stream.id,
                            1,
                            e.event_type,
                            e.schema_version,
                            e.new.event_id,
                            None,
                            Jsonb(e.body, dumps=lambda b: b),
                            e.payload,
                            None,
                            None,
                            "bench",
                            None,
                        )
                    )
            raw_s += time.perf_counter() - began
            began = time.perf_counter()
            log.append(ours_events[i : i + batch])
            ours_s += time.perf_counter() - began
    return total / ours_s, total / raw_s


def bench_small(log: PostgresEventLog, url: str, n: int) -> tuple[float, float]:
    ours, raw = [], []
    with psycopg.connect(url, autocommit=True) as conn:
        for i in track(range(n), description="single appends", console=console):
            ev = NewEvent(
                ExecutionDispatched(execution_id=f"s{i}", run_id="bench", group_id="g", policy_version=0)
            )
            t = time.perf_counter()
            log.append([ev])
            ours.append(time.perf_counter() - t)
            t = time.perf_counter()
            conn.execute(
                "INSERT INTO bare_events (position, stream_type, stream_id, stream_version, event_type, "
                "schema_version, event_id, body, run_id) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                (
                    i,
                    "execution",
                    f"s{i}",
                    1,
                    "execution.dispatched",
                    1,
                    uuid.uuid4(),
                    Jsonb({"execution_id": f"s{i}", "run_id": "bench", "group_id": "g", "policy_version": 0}),
                    "bench",
                ),
                prepare=True,
            )
            raw.append(time.perf_counter() - t)
    return statistics.median(ours) * 1e3, statistics.median(raw) * 1e3


@dataclass(frozen=True)
class Rebuild:
    """One rebuild's seconds, the mean seconds of reading what it folds, and how much it folds."""

    rebuild_s: float
    read_s: float
    events: int  # events the rebuild reads: its projection's types, up to the log's head


def verdict(ok: bool) -> str:
    return "MET" if ok else "MISSED"


def bench_small_bulk_fill(log: PostgresEventLog, n: int) -> None:
    for i in track(range(0, n, 1000), description=f"filling {n} small events", console=console):
        log.append(
            [
                NewEvent(
                    ExecutionDispatched(execution_id=f"f{j}", run_id="fill", group_id="g", policy_version=0)
                )
                if j % 2 == 0
                else NewEvent(ExecutionStarted(execution_id=f"f{j - 1}", run_id="fill", engine="e0"))
                for j in range(i, min(i + 1000, n))
            ]
        )


def bench_read(log: PostgresEventLog, url: str, start: int, end: int) -> tuple[float, float]:
    began = time.perf_counter()
    pos, count = start, 0
    while pos < end:
        events = log.read(pos, limit=5000, until=end)
        count += len(events)
        pos = events[-1].position
    ours = count / (time.perf_counter() - began)
    with psycopg.connect(url) as conn, conn.cursor(binary=True) as cur:
        began = time.perf_counter()
        cur.execute(
            "SELECT * FROM gyre_events WHERE position > %s AND position <= %s ORDER BY position", (start, end)
        )
        rows = cur.fetchall()
        raw = len(rows) / (time.perf_counter() - began)
    return ours, raw


def bench_rebuild(log: PostgresEventLog, store: PostgresProjectionStore, projection: Projection) -> Rebuild:
    """Rebuild ``projection`` over the whole log, between two timed reads of what it folds.

    The baseline is the rebuild's own read loop (``log.read`` with its batch and event types,
    up to the same head) without the fold, so the ratio is the fold's cost over the same
    events; reading once before and once after and taking the mean cancels a steady drift in
    the machine's load across the three.
    """
    end = log.head()

    def read_all() -> tuple[float, int]:
        began = time.perf_counter()
        position, count = 0, 0
        while position < end:
            events = log.read(position, limit=REBUILD_BATCH, until=end, types=projection.event_types)
            if not events:
                break
            count += len(events)
            position = events[-1].position
        return time.perf_counter() - began, count

    before, count = read_all()
    began = time.perf_counter()
    rebuild(log, store, projection, until=end, batch=REBUILD_BATCH)
    took = time.perf_counter() - began
    after, count_after = read_all()
    if count != count_after:
        raise SystemExit(f"the log changed under the benchmark: {count} events read, then {count_after}")
    return Rebuild(took, (before + after) / 2, count)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--pg", default=os.environ.get("GYRE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
    )
    parser.add_argument(
        "--events", type=int, default=100_000, help="small events for the read and rebuild figures"
    )
    parser.add_argument("--model-calls", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--singles", type=int, default=2000)
    args = parser.parse_args()

    with scratch_database(args.pg, "gyre_bench") as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(BARE)
            conn.execute("ALTER TABLE bare_events ALTER COLUMN payload SET STORAGE EXTERNAL")
        table = Table(title="gyre_store benchmarks (one run, same machine)")
        for col in ("figure", "gyre_store", "baseline", "ratio", "target", "verdict"):
            table.add_column(col)
        with PostgresEventLog(StoreConfig(url)) as log:
            ours, raw = bench_bulk(log, url, args.model_calls, args.batch)
            table.add_row(
                "model-call appends (events/s, 2,048 tokens each)",
                f"{ours:,.0f}",
                f"{raw:,.0f} (raw COPY)",
                f"{ours / raw:.2f}",
                ">= 0.50",
                verdict(ours / raw >= 0.50),
            )
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("TRUNCATE bare_events")
            ours_ms, raw_ms = bench_small(log, url, args.singles)
            table.add_row(
                "single small append p50 (ms)",
                f"{ours_ms:.3f}",
                f"{raw_ms:.3f} (raw INSERT)",
                f"{ours_ms / raw_ms:.2f}",
                "<= 2.00",
                verdict(ours_ms / raw_ms <= 2.0),
            )
            start = log.head()
            bench_small_bulk_fill(log, args.events)
            end = log.head()
            ours_r, raw_r = bench_read(log, url, start, end)
            table.add_row(
                "read in commit order (events/s)",
                f"{ours_r:,.0f}",
                f"{raw_r:,.0f} (raw SELECT rows)",
                f"{ours_r / raw_r:.2f}",
                ">= 50,000/s",
                verdict(ours_r >= 50_000),
            )
            projections = lifecycle_projections()
            store = PostgresProjectionStore(log.pool, projections.tables())
            r = bench_rebuild(log, store, projections.get("counters"))
            table.add_row(
                f"rebuild counters over {r.events:,} events (s)",
                f"{r.rebuild_s:.2f}",
                f"{r.read_s:.2f} (the rebuild's reads of the same {r.events:,} events, "
                "mean of before and after)",
                f"{r.rebuild_s / r.read_s:.2f}",
                "report",
                "no target",
            )
        console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
