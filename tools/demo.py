"""``gyre demo``: a small run end to end on the embedded services (or yours).

Reads top to bottom: open the store, record a run's lifecycle as events (groups
dispatched, executions started and finished, cells changing roles, a publication), catch
the projections up, then show the log, the waterlevel and a replay as of mid-run.
"""

from __future__ import annotations

import argparse
import random
import uuid
from typing import Any

from rich.progress import track

from gyre_store import (
    CellRole,
    CellRoleChanged,
    ExecutionDispatched,
    ExecutionFinished,
    ExecutionStarted,
    FinishReason,
    GroupDispatched,
    InMemoryProjectionStore,
    NewEvent,
    PostgresProjectionStore,
    RunStarted,
    WeightsPublished,
    catch_up,
    rebuild,
)
from tools.cli import add_env_argument
from tools.common import add_store_arguments, all_projections, console, open_store
from tools.events import _line
from tools.projections import print_rows


def register(subparsers: Any) -> None:
    demo = subparsers.add_parser("demo", help="record and show a small run on the embedded default")
    add_store_arguments(demo)
    add_env_argument(demo, "--seed", "GYRE_DEMO_SEED", default="0", type=int, help="random seed")
    add_env_argument(
        demo, "--groups", "GYRE_DEMO_GROUPS", default="4", type=int, help="rollout groups (B * bursts)"
    )
    add_env_argument(
        demo, "--group-size", "GYRE_DEMO_GROUP_SIZE", default="4", type=int, help="executions per group N"
    )
    demo.set_defaults(func=run)


def lifecycle_events(run_id: str, groups: int, n: int, rng: random.Random) -> list[NewEvent]:
    """A plausible event sequence of a short run with K=2 cells and C_e=8."""
    out = [
        NewEvent(
            RunStarted(
                run_id=run_id,
                harness="claude-code",
                model="tiny-qwen3",
                group_size=n,
                batch_groups=2,
                cells=2,
                cell_capacity=8,
                phi=0.5,
                mu=1,
            ),
            expected_version=0,
        )
    ]
    executions = []
    for g in range(groups):
        gid = f"{run_id}-g{g}"
        out.append(
            NewEvent(GroupDispatched(group_id=gid, run_id=run_id, query_id=f"q{g}", size=n, policy_version=0))
        )
        for k in range(n):
            eid = f"{gid}-e{k}"
            executions.append(eid)
            out.append(
                NewEvent(ExecutionDispatched(execution_id=eid, run_id=run_id, group_id=gid, policy_version=0))
            )
    running: list[str] = []
    for eid in executions:
        out.append(
            NewEvent(ExecutionStarted(execution_id=eid, run_id=run_id, engine=f"cell{rng.randrange(2)}"))
        )
        running.append(eid)
        if len(running) > 6:
            done = running.pop(rng.randrange(len(running)))
            reason = FinishReason.COMPLETED if rng.random() > 0.1 else FinishReason.HARNESS_TIMEOUT
            out.append(NewEvent(ExecutionFinished(execution_id=done, run_id=run_id, reason=reason)))
    out.append(
        NewEvent(
            CellRoleChanged(run_id=run_id, cell_index=0, role=CellRole.TRAINING, previous=CellRole.ROLLOUT)
        )
    )
    for done in running:
        out.append(
            NewEvent(ExecutionFinished(execution_id=done, run_id=run_id, reason=FinishReason.COMPLETED))
        )
    out.append(NewEvent(WeightsPublished(run_id=run_id, policy_version=1, step=1)))
    out.append(
        NewEvent(
            CellRoleChanged(run_id=run_id, cell_index=0, role=CellRole.ROLLOUT, previous=CellRole.TRAINING)
        )
    )
    return out


def run(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    run_id = f"demo-{uuid.uuid4().hex[:8]}"
    projections = all_projections()
    with open_store(args) as opened:
        log = opened.log
        start = log.head()
        console.rule(f"[bold]gyre demo: run {run_id}")
        events = lifecycle_events(run_id, args.groups, args.group_size, rng)
        for i in track(range(0, len(events), 8), description="recording events"):
            log.append(events[i : i + 8])
        console.print(f"recorded {len(events)} events at positions {start + 1}..{log.head()}")

        console.rule("the log (last 12 events)")
        for ev in log.read(max(start, log.head() - 12), limit=12):
            console.print(_line(ev, False), markup=False, soft_wrap=True)

        store = PostgresProjectionStore(log.pool, projections.tables())
        for p in projections:
            catch_up(log, store, p)
        console.rule("projections")
        with log.pool.connection() as conn:
            cur = conn.execute("SELECT * FROM gyre_waterlevel_v WHERE run_id = %s", (run_id,))
            cols = [d.name for d in cur.description or []]
            print_rows(
                "gyre_waterlevel_v (d, p, f and w = d - f)", [dict(zip(cols, r, strict=True)) for r in cur]
            )
        print_rows("gyre_cell_roles", [r for r in store.dump("gyre_cell_roles") if r["run_id"] == run_id])

        middle = start + len(events) // 2
        console.rule(f"replay as of position {middle} (live projections untouched)")
        counters = projections.get("counters")
        memory = InMemoryProjectionStore({t.name: t for t in counters.tables})
        rebuild(log, memory, counters, until=middle)
        print_rows(
            "gyre_counters as of mid-run", [r for r in memory.dump("gyre_counters") if r["run_id"] == run_id]
        )
    return 0
