"""``gyre db upgrade|check|downgrade``: the database schema."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gyre_store.db import migrate, services
from gyre_tools.common import add_store_arguments, console


def register(subparsers: Any) -> None:
    db = subparsers.add_parser("db", help="migrate and check the database schema")
    sub = db.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    up = sub.add_parser("upgrade", help="migrate the database to the newest schema")
    add_store_arguments(up)
    up.add_argument("--revision", default="head", help="target revision (default head)")
    up.set_defaults(func=upgrade)
    check = sub.add_parser("check", help="verify the schema is at head and matches the models")
    add_store_arguments(check)
    check.set_defaults(func=check_schema)
    down = sub.add_parser("downgrade", help="migrate the database down to REVISION (base drops all)")
    add_store_arguments(down)
    down.add_argument("revision")
    down.set_defaults(func=downgrade)


def upgrade(args: argparse.Namespace) -> int:
    with services(args.database_url, None, Path(args.data_dir), with_redis=False) as svc:
        migrate.upgrade(svc.database_url, args.revision)
        console.print(f"database at revision {migrate.current_revision(svc.database_url)}")
    return 0


def downgrade(args: argparse.Namespace) -> int:
    with services(args.database_url, None, Path(args.data_dir), with_redis=False) as svc:
        migrate.downgrade(svc.database_url, args.revision)
        console.print(f"database at revision {migrate.current_revision(svc.database_url)}")
    return 0


def check_schema(args: argparse.Namespace) -> int:
    with services(args.database_url, None, Path(args.data_dir), with_redis=False) as svc:
        current = migrate.current_revision(svc.database_url)
        head = migrate.head_revision()
        if current != head:
            console.print(
                f"[red]database is at revision {current}, code expects {head}: run `gyre db upgrade`[/red]"
            )
            return 1
        diffs = migrate.schema_differences(svc.database_url)
        if diffs:
            console.print("[red]schema differs from the models:[/red]")
            for d in diffs:
                console.print(f"  {d}")
            return 1
        console.print(f"[green]schema at {head} and matches the models[/green]")
    return 0
