"""``gyre replay --until POSITION``: every projection as of a position in the log.

Replays into memory and prints the rows, or with ``--schema NAME`` into a PostgreSQL
schema of that name for SQL queries; the live projections are never touched.
"""

from __future__ import annotations

import argparse
from typing import Any

from gyre_store import InMemoryProjectionStore, PostgresProjectionStore, ProjectionStore, rebuild
from gyre_tools.cli import add_env_argument
from gyre_tools.common import add_store_arguments, all_projections, console, open_store
from gyre_tools.projections import print_rows


def register(subparsers: Any) -> None:
    rp = subparsers.add_parser("replay", help="rebuild projections as of a log position, off to the side")
    add_store_arguments(rp)
    add_env_argument(
        rp, "--until", "GYRE_REPLAY_UNTIL", type=int, help="last position to include (default: head)"
    )
    rp.add_argument(
        "--schema", help="replay into this PostgreSQL schema instead of memory (replaced if present)"
    )
    rp.add_argument("--projection", action="append", help="only these projections (repeatable)")
    rp.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    projections = all_projections()
    chosen = [projections.get(n) for n in args.projection] if args.projection else list(projections)
    tables = {t.name: t for p in chosen for t in p.tables}
    with open_store(args) as opened:
        until = args.until if args.until is not None else opened.log.head()
        store: ProjectionStore
        if args.schema:
            pg_store = PostgresProjectionStore(opened.log.pool, tables, schema=args.schema)
            pg_store.create_schema()
            store = pg_store
        else:
            store = InMemoryProjectionStore(tables, opened.log)
        for p in chosen:
            rebuild(opened.log, store, p, until=until)
        console.print(f"[bold]projections as of position {until}[/bold] (head is {opened.log.head()})")
        for name in tables:
            print_rows(name, store.dump(name), limit=20)
        if args.schema:
            console.print(
                f"replayed into schema {args.schema}: query it with SQL, e.g. SELECT * FROM {args.schema}.{next(iter(tables))}"
            )
    return 0
