"""``gyre projections rebuild|catch-up|show``: the tables derived from the log."""

from __future__ import annotations

import argparse
import time
from typing import Any

from rich.table import Table

from gyre_store import PostgresProjectionStore, catch_up, rebuild
from gyre_tools.common import add_store_arguments, all_projections, console, open_store


def register(subparsers: Any) -> None:
    proj = subparsers.add_parser("projections", help="maintain and inspect projections")
    sub = proj.add_subparsers(dest="projections_command", metavar="ACTION", required=True)
    rb = sub.add_parser("rebuild", help="drop and rebuild projections from the log (all, or NAME)")
    add_store_arguments(rb)
    rb.add_argument("name", nargs="?", help="one projection (default: all)")
    rb.set_defaults(func=run_rebuild)
    cu = sub.add_parser("catch-up", help="apply events after each projection's checkpoint")
    add_store_arguments(cu)
    cu.set_defaults(func=run_catch_up)
    show = sub.add_parser("show", help="print a projection's rows")
    add_store_arguments(show)
    show.add_argument("name")
    show.set_defaults(func=run_show)


def run_rebuild(args: argparse.Namespace) -> int:
    projections = all_projections()
    chosen = [projections.get(args.name)] if args.name else list(projections)
    with open_store(args) as opened:
        store = PostgresProjectionStore(opened.log.pool, projections.tables())
        for p in chosen:
            started = time.perf_counter()
            end = rebuild(opened.log, store, p)
            console.print(f"rebuilt {p.name} up to position {end} in {time.perf_counter() - started:.2f}s")
    return 0


def run_catch_up(args: argparse.Namespace) -> int:
    projections = all_projections()
    with open_store(args) as opened:
        store = PostgresProjectionStore(opened.log.pool, projections.tables())
        for p in projections:
            console.print(f"{p.name}: at position {catch_up(opened.log, store, p)}")
    return 0


def print_rows(title: str, rows: list[dict[str, Any]], limit: int = 50) -> None:
    table = Table(title=title)
    if not rows:
        console.print(f"{title}: (no rows)")
        return
    for col in rows[0]:
        table.add_column(col)
    for row in rows[:limit]:
        table.add_row(*("" if v is None else str(v) for v in row.values()))
    console.print(table)
    if len(rows) > limit:
        console.print(f"... {len(rows) - limit} more rows")


def run_show(args: argparse.Namespace) -> int:
    projections = all_projections()
    projection = projections.get(args.name)
    with open_store(args) as opened:
        store = PostgresProjectionStore(opened.log.pool, projections.tables())
        catch_up(opened.log, store, projection)
        for t in projection.tables:
            print_rows(t.name, store.dump(t.name))
    return 0
