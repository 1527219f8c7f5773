"""``gyre sched replay --run RUN_ID``: replay a run's recorded scheduler inputs and check it.

Prints whether a fresh decision core reproduced the recorded decisions, the invariant
check over the replayed log and the store's lifecycle agreement; exit status 1 when
any of them fails, 2 when nothing is recorded for the run.
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.table import Table

from gyre_sched import NoRecordedRunError
from gyre_sched.live import ReplayReport, replay_run
from gyre_store import GyreStoreError
from gyre_tools.cli import add_env_argument
from gyre_tools.common import add_store_arguments, console, open_store

SHOWN = 10  # differences and violations listed per kind


def register(subparsers: Any) -> None:
    """Add ``gyre sched`` and its ``replay`` subcommand."""
    sp = subparsers.add_parser("sched", help="the scheduler's recorded decisions")
    sub = sp.add_subparsers(dest="sched_command", metavar="SUBCOMMAND")
    sub.required = True
    rp = sub.add_parser(
        "replay",
        help="replay a run's scheduler inputs through a fresh core and compare decisions",
        description="Reads the run's sched.* events, replays the inputs, compares every decision, "
        "checks the scheduling invariants and the execution lifecycle events.",
    )
    add_store_arguments(rp)
    add_env_argument(rp, "--run", "GYRE_RUN_ID", help="the run id to replay")
    rp.set_defaults(func=run)


def render(report: ReplayReport) -> Table:
    """The report as one table: a summary row per check, then the first findings."""
    table = Table(title=f"scheduler replay of run {report.run_id}")
    table.add_column("check")
    table.add_column("result")
    table.add_column("detail")

    def verdict(ok: bool) -> str:
        return "[green]ok[/green]" if ok else "[red]FAILED[/red]"

    table.add_row(
        "decisions",
        verdict(report.matched),
        f"{report.inputs} inputs, {report.decisions} decisions recorded; {len(report.diffs)} differ",
    )
    for diff in report.diffs[:SHOWN]:
        shown = diff.detail or f"recorded {diff.recorded!r}, replayed {diff.replayed!r}"
        table.add_row("", diff.kind.value, f"input {diff.seq} decision {diff.index}: {shown}")
    table.add_row("invariants", verdict(not report.violations), f"{len(report.violations)} violations")
    for violation in report.violations[:SHOWN]:
        table.add_row("", violation.kind.value, f"t={violation.at:.1f}s {violation.detail}")
    table.add_row("lifecycle", verdict(not report.lifecycle), f"{len(report.lifecycle)} disagreements")
    for item in report.lifecycle[:SHOWN]:
        table.add_row("", f"position {item.position}", f"{item.execution_id}: {item.detail}")
    return table


def run(args: argparse.Namespace) -> int:
    """Run ``gyre sched replay``; 0 when everything matched, 1 on any failure, 2 on no run."""
    if not args.run:
        console.print("[red]gyre sched replay: --run (or GYRE_RUN_ID) is required[/red]")
        return 2
    try:
        with open_store(args, upgrade=False) as opened:
            report = replay_run(opened.log, args.run)
    except (NoRecordedRunError, GyreStoreError) as exc:
        console.print(f"[red]gyre sched replay: {exc}[/red]")
        return 2
    console.print(render(report))
    return 0 if report.ok else 1
