"""The database itself: Alembic migrations to head and the check of the migrated schema
against ``gyre_store.schema``, and embedded PostgreSQL and Redis servers for a machine with none.

Imported on its own (``gyre_store.db``): the root package does not load Alembic.
"""

from __future__ import annotations

from gyre_store.db.embedded import Services, default_data_dir, services
from gyre_store.db.migrate import (
    MIGRATIONS_DIR,
    alembic_config,
    current_revision,
    downgrade,
    head_revision,
    schema_differences,
    upgrade,
)

__all__ = [
    "MIGRATIONS_DIR",
    "Services",
    "alembic_config",
    "current_revision",
    "default_data_dir",
    "downgrade",
    "head_revision",
    "schema_differences",
    "services",
    "upgrade",
]
