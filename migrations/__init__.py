"""Alembic migrations of gyre's schema, installed as ``gyre_store.migrations``."""
