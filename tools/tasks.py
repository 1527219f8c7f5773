"""``gyre tasks list|show|check SOURCE``: read a task source (a folder of Harbor tasks, a
``.jsonl`` file or ``builtin:<family>``) and check each task against Harbor's contract in a
sandbox. Reading a source runs nothing; ``check`` runs each task's tests and solution."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.progress import Progress
from rich.table import Table

from gyre_tools.common import console
from gyre_train.sandbox import KINDS, sandbox_for
from gyre_train.tasks import CheckResult, Task, TaskSource, Verdict, check_or_error, open_source

SHOWN_FILES = 40  # how many workspace files ``show`` names


def register(subparsers: Any) -> None:
    tasks = subparsers.add_parser("tasks", help="list, show and check the tasks of a task source")
    sub = tasks.add_subparsers(dest="tasks_command", metavar="ACTION", required=True)
    source_help = "a folder of Harbor tasks (or one task folder), a .jsonl file, or builtin:<family>"
    listing = sub.add_parser("list", help="one line per task: split, workspace hash, timeouts, solution")
    listing.add_argument("source", metavar="SOURCE", help=source_help)
    listing.set_defaults(func=run_list)
    show = sub.add_parser("show", help="everything gyre read about one task")
    show.add_argument("source", metavar="SOURCE", help=source_help)
    show.add_argument("task_id", metavar="TASK_ID")
    show.set_defaults(func=run_show)
    check = sub.add_parser(
        "check",
        help="each task's tests must fail on the untouched workspace and pass after its solution",
    )
    check.add_argument("source", metavar="SOURCE", help=source_help)
    check.add_argument(
        "--sandbox",
        choices=KINDS,
        default=None,
        help="where the tests run (default: bwrap for Harbor tasks, local otherwise)",
    )
    check.add_argument("--task", action="append", default=None, help="check only this task (repeatable)")
    check.add_argument("--json", type=Path, default=None, metavar="FILE", help="also write the results here")
    check.set_defaults(func=run_check)


def run_list(args: argparse.Namespace) -> int:
    source = open_source(args.source)
    table = Table(title=f"{escape(source.spec)}: {len(source.tasks)} {source.kind} tasks")
    for column in ("task", "split", "workspace", "agent s", "verifier s", "solution"):
        table.add_column(column, justify="right" if column.endswith(" s") else "left")
    for task in source.tasks:
        table.add_row(
            escape(task.id),
            task.split.value,
            task.workspace_hash[:19],
            f"{task.agent_timeout_s:g}",
            f"{task.verifier_timeout_s:g}",
            "yes" if task.solution is not None else "no",
        )
    console.print(table)
    return 0


def run_show(args: argparse.Namespace) -> int:
    task = open_source(args.source).task(args.task_id)
    names = task.workspace.names()
    rows: list[tuple[str, str]] = [
        ("id", task.id),
        ("source", f"{task.source} ({task.kind})"),
        ("split", task.split.value),
        ("workspace", f"{task.workspace_hash}, {len(names)} files, at {task.workdir} in a sandbox"),
        ("files", ", ".join(names[:SHOWN_FILES]) + (" ..." if len(names) > SHOWN_FILES else "")),
        ("tests", ", ".join(task.tests.names()) or "(none)"),
        ("test command", " ".join(task.test_command)),
        ("solution", " ".join(task.solve_command) if task.solution is not None else "(none)"),
        ("timeouts", f"agent {task.agent_timeout_s:g} s, verifier {task.verifier_timeout_s:g} s"),
        ("resources", _resources(task)),
        ("image", task.image or "(none)"),
        ("dockerfile", str(task.dockerfile) if task.dockerfile else "(none)"),
        ("env", ", ".join(f"{k}={v}" for k, v in task.env.items()) or "(none)"),
    ]
    if task.unsupported:
        rows.append(("not under bwrap", ", ".join(f"line {n}: {kw}" for n, kw in task.unsupported)))
    if task.metadata:
        rows.append(("metadata", json.dumps(task.metadata, default=str)))
    table = Table(show_header=False, title=escape(task.id))
    table.add_column("field", style="bold")
    table.add_column("value")
    for field, value in rows:
        table.add_row(field, escape(value))
    console.print(table)
    console.print(escape(task.prompt.rstrip()))
    return 0


def _resources(task: Task) -> str:
    r = task.resources
    parts = [f"{r.cpus:g} cpus" if r.cpus else "", f"{r.memory_mb} MB memory" if r.memory_mb else ""]
    parts.append(f"{r.storage_mb} MB storage" if r.storage_mb else "")
    return ", ".join(p for p in parts if p) or "(defaults)"


def run_check(args: argparse.Namespace) -> int:
    source = open_source(args.source)
    kind = args.sandbox or ("bwrap" if source.kind == "harbor" else "local")
    sandbox = sandbox_for(kind)
    tasks = [source.task(t) for t in args.task] if args.task else list(source.tasks)
    results: list[CheckResult] = []
    with Progress(console=console, transient=True) as progress:
        bar = progress.add_task(f"checking {len(tasks)} tasks in {kind}", total=len(tasks))
        for task in tasks:
            progress.update(bar, description=f"{escape(task.id)} ({kind})")
            results.append(check_or_error(task, sandbox))
            progress.advance(bar)
    console.print(check_table(source, kind, results))
    failed = [r for r in results if r.failed]
    for r in failed:
        console.print(f"[red]FAIL[/red] {escape(r.task_id)}: {escape(r.detail)}")
    if args.json is not None:
        args.json.write_text(json.dumps(check_json(source, kind, results), indent=2) + "\n")
    return 1 if failed else 0


def check_table(source: TaskSource, kind: str, results: list[CheckResult]) -> Table:
    table = Table(title=f"{escape(source.spec)} in {kind}: Harbor's contract")
    for column in ("task", "untouched", "solved", "seconds", "verdict"):
        table.add_column(column, justify="left" if column in ("task", "verdict") else "right")
    colour = {Verdict.OK: "green", Verdict.NO_SOLUTION: "yellow", Verdict.FAIL: "red"}
    for r in results:
        table.add_row(
            escape(r.task_id),
            _reward(r.untouched),
            _reward(r.solved),
            f"{r.seconds:.2f}",
            f"[{colour[r.verdict]}]{r.verdict.value}[/]",
        )
    return table


def check_json(source: TaskSource, kind: str, results: list[CheckResult]) -> dict[str, Any]:
    return {
        "source": source.spec,
        "sandbox": kind,
        "failed": sum(r.failed for r in results),
        "tasks": [
            {
                "task": r.task_id,
                "untouched": r.untouched,
                "solved": r.solved,
                "seconds": round(r.seconds, 3),
                "verdict": r.verdict.value,
                "detail": r.detail,
            }
            for r in results
        ],
    }


def _reward(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"
