"""Real-PostgreSQL test databases: migrate a template once, copy it for every test.

The machine's server (``GYRE_TEST_PG``, default 127.0.0.1:5432, user postgres) is used
for real; each test gets a database of its own created from the migrated template.
"""

from __future__ import annotations

import os
import urllib.parse
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql

ADMIN_URL = os.environ.get("GYRE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def url_for(dbname: str) -> str:
    """ADMIN_URL with its database replaced (keeps a ``?host=/socket/dir`` query)."""
    parts = urllib.parse.urlsplit(ADMIN_URL)
    return urllib.parse.urlunsplit(parts._replace(path=f"/{dbname}"))


def admin() -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(ADMIN_URL, autocommit=True)


def create_template() -> str:
    """Create and migrate a template database; return its name."""
    from gyre_store.db import migrate

    name = f"gyre_tpl_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    with admin() as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    migrate.upgrade(url_for(name))
    return name


def drop(name: str) -> None:
    with admin() as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@contextmanager
def database_from(template: str) -> Iterator[str]:
    """A fresh database copied from ``template``; yields its URL, drops it afterwards."""
    name = f"gyre_t_{uuid.uuid4().hex[:12]}"
    with admin() as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(template))
        )
    try:
        yield url_for(name)
    finally:
        drop(name)
