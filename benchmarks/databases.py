"""A fresh, migrated database on the machine's PostgreSQL, for the live benchmarks."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


def fresh_database(prefix: str) -> str:
    """Create ``<prefix>_<seconds>`` and migrate it; kept afterwards, so a report can read it."""
    name = f"{prefix}_{int(time.time())}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    migrate = [sys.executable, "-m", "gyre_tools.cli", "db", "upgrade"]
    subprocess.run(migrate, cwd=ROOT, env={**os.environ, "GYRE_DATABASE_URL": url}, check=True)
    return url
