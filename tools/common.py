"""Options and set-up shared by the subcommands: where the store is, and opening it."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from gyre_sched import register_sched_events
from gyre_store import (
    PostgresEventLog,
    ProjectionSet,
    StoreConfig,
    evaluation_projections,
    lifecycle_projections,
)
from gyre_store.db import Services, default_data_dir, migrate, services
from gyre_store.trees import TreeProjection
from gyre_tools.cli import add_env_argument

console = Console(highlight=False)


def add_store_arguments(parser: argparse.ArgumentParser) -> None:
    add_env_argument(
        parser,
        "--database-url",
        "GYRE_DATABASE_URL",
        help="PostgreSQL URL; unset: start an embedded server under --data-dir",
    )
    add_env_argument(
        parser,
        "--redis-url",
        "GYRE_REDIS_URL",
        help="Redis URL; unset: start an embedded server under --data-dir",
    )
    add_env_argument(
        parser,
        "--data-dir",
        "GYRE_DATA_DIR",
        default=str(default_data_dir()),
        help="folder for the embedded servers' data",
    )


@dataclass
class Opened:
    services: Services
    log: PostgresEventLog


def all_projections() -> ProjectionSet:
    """Every projection gyre maintains, from all packages."""
    return ProjectionSet([*lifecycle_projections(), TreeProjection(), *evaluation_projections()])


@contextlib.contextmanager
def open_store(
    args: argparse.Namespace, *, upgrade: bool = True, with_redis: bool = False
) -> Iterator[Opened]:
    """Start or reach the services, migrate the database to head, open the event log.

    The log decodes every event type of every package: the store's own catalog, and the
    scheduler's ``sched.*`` types, registered here explicitly.
    """
    register_sched_events()
    with services(args.database_url, args.redis_url, Path(args.data_dir), with_redis=with_redis) as svc:
        if svc.embedded_database:
            console.print(f"[dim]embedded PostgreSQL: {svc.database_url}[/dim]")
        if upgrade:
            migrate.upgrade(svc.database_url)
        with PostgresEventLog(StoreConfig(svc.database_url)) as log:
            yield Opened(svc, log)
