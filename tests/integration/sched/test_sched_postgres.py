"""The controller with PostgreSQL as its log: replay, tampering, restarts, SQL, workloads."""

from __future__ import annotations

import argparse
import pathlib

import msgspec
import psycopg
import pytest

from gyre_sched import BeginTransition, SchedDecision, replay_run, simulate, workload_from_run
from gyre_sched.live import DiffKind, load_run
from gyre_sched.sim import WORKLOADS
from gyre_store import (
    Event,
    InMemoryEventLog,
    NewEvent,
    PostgresEventLog,
    PostgresProjectionStore,
    RecordedEvent,
    StoreConfig,
    catch_up,
    lifecycle_projections,
)
from gyre_tools import cli
from gyre_tools import sched as sched_cli
from tests.unit.sched.helpers import small_cluster, tiny
from tests.unit.sched.test_controller import RUN, drive

pytestmark = pytest.mark.integration

# The query docs/scheduler.md shows for a run's transitions.
TRANSITIONS_SQL = """
SELECT position,
       (body->'decision'->>'cell')::int      AS cell,
       body->'decision'->>'direction'        AS direction,
       (body->'decision'->>'at')::float8     AS at_s,
       (body->'decision'->>'w')::int         AS w,
       (body->'decision'->>'c_r')::int       AS c_r,
       (body->'decision'->>'c_e')::int       AS c_e
  FROM gyre_events
 WHERE stream_type = 'sched' AND stream_id = %(run)s
   AND event_type = 'sched.decision'
   AND body->'decision'->>'type' = 'BeginTransition'
 ORDER BY position
"""

STEPS_SQL = """
SELECT d.position AS decided_at, (d.body->'decision'->>'cell')::int AS cell,
       s.body->>'step' AS step, s.body->>'engine' AS engine, (s.body->>'count')::int AS count,
       s.recorded_at
  FROM gyre_events d
  JOIN gyre_events s
    ON s.stream_type = 'sched' AND s.stream_id = d.stream_id AND s.event_type = 'sched.step'
   AND s.body->'seq' = d.body->'seq' AND s.body->'decision' = d.body->'index'
 WHERE d.stream_type = 'sched' AND d.stream_id = %(run)s AND d.event_type = 'sched.decision'
   AND d.body->'decision'->>'type' = 'BeginTransition'
 ORDER BY s.position
"""


def test_a_run_driven_through_postgres_replays_identically(
    database_url: str, pg_log: PostgresEventLog
) -> None:
    drive(pg_log, tiny())
    with PostgresEventLog(StoreConfig(database_url)) as fresh:  # read back by another connection pool
        report = replay_run(fresh, RUN)
        entries = load_run(fresh, RUN).entries
    assert report.diffs == () and report.violations == () and report.lifecycle == ()
    sim = simulate(tiny(), small_cluster(), WORKLOADS["nl2repo-122b"], steps=6, seed=4, keep_log=True)
    assert list(entries) == sim.log[: len(entries)] and len(entries) > 100

    # A copy of the log with one decision changed: the replay must notice.
    def forge(recorded: RecordedEvent) -> Event:
        ev = recorded.event
        if (
            isinstance(ev, SchedDecision)
            and isinstance(ev.decision, BeginTransition)
            and ev.seq == forged_seq
        ):
            return msgspec.structs.replace(
                ev, decision=msgspec.structs.replace(ev.decision, c_r=ev.decision.c_r - 8)
            )
        return ev

    forged_seq = next(
        i for i, e in enumerate(entries) if any(isinstance(d, BeginTransition) for d in e.decisions)
    )
    copy = InMemoryEventLog()
    for recorded in pg_log.read(limit=10**9):
        copy.append([NewEvent(forge(recorded), metadata=recorded.metadata)])
    tampered = replay_run(copy, RUN)
    assert [(d.kind, d.seq) for d in tampered.diffs] == [(DiffKind.CHANGED, forged_seq)]


def test_restarts_on_postgres_give_the_uninterrupted_log(pg_log: PostgresEventLog) -> None:
    restarted = drive(pg_log, tiny(), restart_every=5, fail_on="update_routing")
    uninterrupted = drive(InMemoryEventLog(), tiny())
    assert restarted.restarts > 20
    assert load_run(pg_log, RUN).entries == load_run(uninterrupted.log, RUN).entries
    assert restarted.world.calls.calls == uninterrupted.world.calls.calls


def test_transitions_roles_and_workload_by_sql(database_url: str, pg_log: PostgresEventLog) -> None:
    driven = drive(pg_log, tiny())
    begins = [d for e in load_run(pg_log, RUN).entries for d in e.decisions if isinstance(d, BeginTransition)]
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(TRANSITIONS_SQL, {"run": RUN}).fetchall()
    assert [(r[1], r[2], r[4], r[5], r[6]) for r in rows] == [
        (d.cell, d.direction.value, d.w, d.c_r, d.c_e) for d in begins
    ]
    with psycopg.connect(database_url) as conn:
        steps = conn.execute(STEPS_SQL, {"run": RUN}).fetchall()
    firsts = [step for _, _, step, _, _, _ in steps if step in ("stop_accepting", "release_training_memory")]
    assert len(firsts) == len(begins)
    assert {step for _, _, step, _, _, _ in steps} >= {"cancel_and_retry", "restore_rollout_engine"}
    assert all(w <= c_r - c_e for _, _, direction, _, w, c_r, c_e in rows if direction == "rollout_to_train")

    projections = lifecycle_projections()
    store = PostgresProjectionStore(pg_log.pool, {t.name: t for p in projections for t in p.tables})
    for projection in projections:
        catch_up(pg_log, store, projection)
    roles = {row["cell_index"]: row["role"] for row in store.dump("gyre_cell_roles")}
    expected = {"rollout": "rollout", "train": "training"}
    for cell, role in enumerate(driven.controller.state().roles):
        assert roles.get(cell, "rollout") == expected.get(role.value, "transitioning")

    model = workload_from_run(pg_log, RUN)
    finished = driven.controller.state().counters.f
    assert sum(len(g.durations_s) for g in model.groups) == finished > 0


def test_gyre_sched_replay_command(
    database_url: str, pg_log: PostgresEventLog, capsys: pytest.CaptureFixture[str]
) -> None:
    drive(pg_log, tiny())
    args = argparse.Namespace(database_url=database_url, redis_url=None, data_dir="/nonexistent", run=RUN)
    assert sched_cli.run(args) == 0
    out = capsys.readouterr().out
    assert "scheduler replay of run" in out and "FAILED" not in out
    assert sched_cli.run(argparse.Namespace(**{**vars(args), "run": "nope"})) == 2


def test_gyre_sched_replay_fails_on_a_forged_decision(database_url: str, pg_log: PostgresEventLog) -> None:
    drive(pg_log, tiny())
    entry = load_run(pg_log, RUN).entries[0]
    forged = SchedDecision(run_id=RUN, seq=0, index=len(entry.decisions), decision=entry.decisions[0])
    pg_log.append([NewEvent(forged)])
    args = argparse.Namespace(database_url=database_url, redis_url=None, data_dir="/nonexistent", run=RUN)
    assert sched_cli.run(args) == 1


def test_gyre_simulate_with_a_stored_workload(
    database_url: str, pg_log: PostgresEventLog, tmp_path: pathlib.Path
) -> None:
    drive(pg_log, tiny())
    argv = ["simulate", "--preset", "smoke", "--steps", "1", "--plots", "off", "--out", str(tmp_path)]
    assert cli.main([*argv, "--database-url", database_url, "--workload-from-run", RUN]) == 0
    (written,) = tmp_path.glob("*.json")
    assert msgspec.json.decode(written.read_bytes())["result"]["workload"] == f"run:{RUN}"
    assert cli.main([*argv, "--database-url", database_url, "--workload-from-run", "nope"]) == 2
