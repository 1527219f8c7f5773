"""Schema migrations: upgrade a database to head and check it against the models.

Alembic runs the explicit-SQL migrations in ``migrations/``; the check compares the
migrated schema with ``gyre_store.schema`` so a migration and its model cannot drift.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from gyre_store.schema import metadata

# The migrations ship as the package ``gyre_store.migrations`` (the top-level ``migrations/``
# folder, mapped in pyproject.toml); Alembic reads them from that folder on disk.
MIGRATIONS_DIR = Path(str(importlib.resources.files("gyre_store.migrations")))


def _sqlalchemy_url(url: str) -> str:
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def alembic_config(url: str) -> Config:
    cfg = Config(str(MIGRATIONS_DIR / "alembic.ini"))
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["url"] = _sqlalchemy_url(url)
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate the database at ``url`` up to ``revision``."""
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    """Migrate the database at ``url`` down to ``revision`` (``base`` drops everything)."""
    command.downgrade(alembic_config(url), revision)


def head_revision() -> str:
    script = ScriptDirectory.from_config(alembic_config("postgresql://unused"))
    head = script.get_current_head()
    assert head is not None, "migrations directory has no head"
    return head


def current_revision(url: str) -> str | None:
    engine = sa.create_engine(_sqlalchemy_url(url), poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(
                conn, opts={"version_table": "gyre_alembic_version"}
            ).get_current_revision()
    finally:
        engine.dispose()


def schema_differences(url: str) -> list[Any]:
    """Differences between the live schema and the models; empty when they agree."""
    engine = sa.create_engine(_sqlalchemy_url(url), poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(
                conn,
                opts={
                    "compare_type": True,
                    "version_table": "gyre_alembic_version",
                    "include_name": lambda name, type_, parent: (
                        type_ != "table" or name != "gyre_alembic_version"
                    ),
                },
            )
            return list(compare_metadata(ctx, metadata))
    finally:
        engine.dispose()
