"""``gyre tracegen``: synthetic Claude Code-shaped executions, recorded as the proxy would."""

from __future__ import annotations

import argparse
import uuid
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from gyre_proxy.engines import qwen_tokenizer
from gyre_proxy.harness import ClaudeCodeHarness
from gyre_proxy.ingest import Ingestor, Qwen3Template, TraceConfig, TraceGenerator
from gyre_store import (
    ExecutionDispatched,
    ExecutionFinished,
    ExecutionStarted,
    FinishReason,
    GroupDispatched,
    NewEvent,
    PostgresProjectionStore,
    catch_up,
)
from gyre_store.trees import TrajectoryRecorder, TreeView
from gyre_tools.cli import add_env_argument
from gyre_tools.common import add_store_arguments, all_projections, console, open_store
from gyre_tools.trees import stats_table


def register(subparsers: Any) -> None:
    tg = subparsers.add_parser("tracegen", help="record synthetic Claude Code-shaped executions")
    add_store_arguments(tg)
    add_env_argument(
        tg, "--executions", "GYRE_TRACEGEN_EXECUTIONS", default="1", type=int, help="how many executions"
    )
    add_env_argument(
        tg,
        "--group-size",
        "GYRE_TRACEGEN_GROUP_SIZE",
        default="4",
        type=int,
        help="executions per rollout group N",
    )
    add_env_argument(
        tg,
        "--requests",
        "GYRE_TRACEGEN_REQUESTS",
        default="420",
        type=int,
        help="main-agent requests per execution",
    )
    add_env_argument(
        tg, "--subagents", "GYRE_TRACEGEN_SUBAGENTS", default="4", type=int, help="sub-agents per execution"
    )
    add_env_argument(
        tg,
        "--compact-at",
        "GYRE_TRACEGEN_COMPACT_AT",
        default="100000",
        type=int,
        help="context tokens that trigger a compaction",
    )
    add_env_argument(tg, "--seed", "GYRE_TRACEGEN_SEED", default="0", type=int, help="random seed")
    add_env_argument(tg, "--run-id", "GYRE_TRACEGEN_RUN_ID", help="run id (default: a new one)")
    tg.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    run_id = args.run_id or f"trace-{uuid.uuid4().hex[:8]}"
    template = Qwen3Template(qwen_tokenizer())
    with open_store(args) as opened:
        log = opened.log
        ingestor = Ingestor(TrajectoryRecorder(log), template, ClaudeCodeHarness())
        ids = []
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=console) as progress:
            for i in range(args.executions):
                group = f"{run_id}-g{i // args.group_size}"
                ex = f"{run_id}-e{i}"
                ids.append(ex)
                if i % args.group_size == 0:
                    log.append(
                        [
                            NewEvent(
                                GroupDispatched(
                                    group_id=group,
                                    run_id=run_id,
                                    query_id=group,
                                    size=args.group_size,
                                    policy_version=0,
                                )
                            )
                        ]
                    )
                log.append(
                    [
                        NewEvent(
                            ExecutionDispatched(
                                execution_id=ex, run_id=run_id, group_id=group, policy_version=0
                            )
                        ),
                        NewEvent(ExecutionStarted(execution_id=ex, run_id=run_id, engine="synthetic")),
                    ]
                )
                task = progress.add_task(f"execution {ex}", total=None)
                cfg = TraceConfig(
                    seed=args.seed + i,
                    main_requests=args.requests,
                    subagents=args.subagents,
                    compact_at=args.compact_at,
                )
                TraceGenerator(ingestor, cfg, progress=lambda n, t=task: progress.update(t, completed=n)).run(
                    ex, run_id
                )
                log.append(
                    [
                        NewEvent(
                            ExecutionFinished(execution_id=ex, run_id=run_id, reason=FinishReason.COMPLETED)
                        )
                    ]
                )
        projections = all_projections()
        store = PostgresProjectionStore(log.pool, projections.tables())
        for p in projections:
            catch_up(log, store, p)
        console.print(stats_table([TreeView.load(store, ex).stats() for ex in ids]))
        console.print(
            f"run {run_id}: {len(ids)} executions recorded; try `gyre trees show --execution {ids[0]}`"
        )
    return 0
