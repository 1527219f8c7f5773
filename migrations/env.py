"""Alembic environment: runs gyre's migrations online against one database."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from gyre_store.schema import metadata

config = context.config
url = config.attributes.get("url") or context.get_x_argument(as_dictionary=True).get("url")
if not url:
    raise SystemExit("no database URL: run `gyre db upgrade`, or pass -x url=postgresql://...")
if url.startswith("postgresql://"):
    url = "postgresql+psycopg://" + url[len("postgresql://") :]

engine = create_engine(url, poolclass=pool.NullPool)
with engine.connect() as connection:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table="gyre_alembic_version",
        transaction_per_migration=True,
    )
    with context.begin_transaction():
        context.run_migrations()
engine.dispose()
