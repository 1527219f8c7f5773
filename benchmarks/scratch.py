"""A scratch PostgreSQL database for one benchmark run: created, migrated, dropped after."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql

from gyre_store.db import migrate


@contextmanager
def scratch_database(admin_url: str, prefix: str) -> Iterator[str]:
    """The URL of a new database ``<prefix>_<random>`` beside ``admin_url``'s, at the newest
    schema; dropped (connections and all) when the block ends."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = admin_url.rsplit("/", 1)[0] + "/" + name
    try:
        migrate.upgrade(url)
        yield url
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
