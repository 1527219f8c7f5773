"""Projection storage on PostgreSQL: live tables in ``public``, or a replay schema.

A replay schema holds copies (``LIKE ... INCLUDING ALL``) of the projection tables and its
own checkpoints, so a run can be rebuilt "as of" any position and queried with SQL while
the live projections are left alone.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
import sqlalchemy as sa
from psycopg import sql
from psycopg.types.json import Jsonb
from sqlalchemy.dialects import postgresql as pg

from gyre_store.exceptions import ConfigError
from gyre_store.log import queries
from gyre_store.log.postgres import translate
from gyre_store.projections.base import Key, Row, RowStore

_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def _payloads(conn: psycopg.Connection[Any], positions: Sequence[int]) -> dict[int, bytes]:
    """The payloads of the events at ``positions`` from the log's table (the one in the
    search path: a replay schema's projection refers to the live log's events)."""
    if not positions:
        return {}
    rows = conn.execute(
        "SELECT position, payload FROM gyre_events WHERE position = ANY(%s) AND payload IS NOT NULL",
        (list(positions),),
    ).fetchall()
    return {int(pos): bytes(blob) for pos, blob in rows}


class _PgRows(RowStore):
    def __init__(self, conn: psycopg.Connection[Any], schema: str, tables: Mapping[str, sa.Table]) -> None:
        super().__init__(tables)
        self._conn = conn
        self._schema = schema
        self._json_columns = {
            name: frozenset(c.name for c in t.columns if isinstance(c.type, pg.JSONB))
            for name, t in tables.items()
        }

    def _ident(self, table: str) -> sql.Composed:
        return sql.Identifier(self._schema, table)  # type: ignore[return-value]

    def _load(self, table: str, key: Key) -> Row | None:
        pk = self._pk[table]
        query = sql.SQL("SELECT * FROM {} WHERE {}").format(
            self._ident(table),
            sql.SQL(" AND ").join(sql.SQL("{} = %s").format(sql.Identifier(c)) for c in pk),
        )
        cur = self._conn.cursor(row_factory=psycopg.rows.dict_row)
        row = cur.execute(query, key).fetchone()
        return dict(row) if row is not None else None

    def _write(self, upserts: Mapping[str, list[Row]], deletes: Mapping[str, list[Key]]) -> None:
        for table, keys in deletes.items():
            pk = self._pk[table]
            query = sql.SQL("DELETE FROM {} WHERE {}").format(
                self._ident(table),
                sql.SQL(" AND ").join(sql.SQL("{} = %s").format(sql.Identifier(c)) for c in pk),
            )
            with self._conn.cursor() as cur:
                cur.executemany(query, keys)
        for table, rows in upserts.items():
            columns = [c.name for c in self.tables[table].columns]
            pk = self._pk[table]
            others = [c for c in columns if c not in pk]
            conflict = (
                sql.SQL("DO UPDATE SET {}").format(
                    sql.SQL(", ").join(
                        sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(c), sql.Identifier(c))
                        for c in others
                    )
                )
                if others
                else sql.SQL("DO NOTHING")
            )
            query = sql.SQL("INSERT INTO {} ({}) VALUES ({}) ON CONFLICT ({}) {}").format(
                self._ident(table),
                sql.SQL(", ").join(map(sql.Identifier, columns)),
                sql.SQL(", ").join(sql.Placeholder() * len(columns)),
                sql.SQL(", ").join(map(sql.Identifier, pk)),
                conflict,
            )
            json_cols = self._json_columns[table]
            params = [
                tuple(Jsonb(r[c]) if c in json_cols and r[c] is not None else r[c] for c in columns)
                for r in rows
            ]
            with self._conn.cursor() as cur:
                cur.executemany(query, params)

    def payloads(self, positions: Sequence[int]) -> dict[int, bytes]:
        return _payloads(self._conn, positions)

    def truncate(self, tables: Sequence[str]) -> None:
        if tables:
            self._conn.execute(
                sql.SQL("TRUNCATE {}").format(sql.SQL(", ").join(self._ident(t) for t in tables))
            )
        for t in tables:
            self._buffer[t].clear()

    def lock_checkpoint(self, name: str) -> int:
        self._conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"{self._schema}:{name}",))
        row = self._conn.execute(
            sql.SQL(queries.GET_CHECKPOINT).format(sql.Identifier(self._schema, "gyre_checkpoints")), (name,)
        ).fetchone()
        return int(row[0]) if row else 0

    def set_checkpoint(self, name: str, position: int) -> None:
        self._conn.execute(
            sql.SQL(queries.SET_CHECKPOINT).format(sql.Identifier(self._schema, "gyre_checkpoints")),
            (name, position),
        )


class PostgresProjectionStore:
    """A :class:`~gyre_store.projections.base.ProjectionStore` over a psycopg connection pool."""

    def __init__(self, pool: Any, tables: Mapping[str, sa.Table], schema: str = "public") -> None:
        if not _SCHEMA_NAME.match(schema):
            raise ConfigError(f"schema name {schema!r} must be a lower-case SQL identifier")
        self._pool = pool
        self.tables = dict(tables)
        self.schema = schema

    def checkpoint(self, name: str) -> int:
        try:
            with self._pool.connection() as conn:
                row = conn.execute(
                    sql.SQL(queries.GET_CHECKPOINT).format(sql.Identifier(self.schema, "gyre_checkpoints")),
                    (name,),
                ).fetchone()
        except psycopg.Error as exc:
            raise translate(exc) from exc
        return int(row[0]) if row else 0

    @contextmanager
    def transaction(self) -> Iterator[RowStore]:
        try:
            with self._pool.connection() as conn, conn.transaction():
                rows = _PgRows(conn, self.schema, self.tables)
                yield rows
                rows.flush()
        except psycopg.Error as exc:
            raise translate(exc) from exc

    def dump(self, table: str) -> list[Row]:
        t = self.tables[table]
        order = [c.name for c in t.primary_key.columns]
        query = sql.SQL("SELECT * FROM {} ORDER BY {}").format(
            sql.Identifier(self.schema, table), sql.SQL(", ").join(map(sql.Identifier, order))
        )
        with self._pool.connection() as conn:
            cur = conn.cursor(row_factory=psycopg.rows.dict_row)
            return [dict(r) for r in cur.execute(query).fetchall()]

    def select(self, table: str, column: str, value: Any) -> list[Row]:
        t = self.tables[table]
        if column not in t.columns:
            raise ConfigError(f"{table} has no column {column!r}")
        order = [c.name for c in t.primary_key.columns]
        query = sql.SQL("SELECT * FROM {} WHERE {} = %s ORDER BY {}").format(
            sql.Identifier(self.schema, table),
            sql.Identifier(column),
            sql.SQL(", ").join(map(sql.Identifier, order)),
        )
        return self._fetch(query, (value,))

    def select_in(self, table: str, column: str, value: Any, among: str, keys: Sequence[Any]) -> list[Row]:
        t = self.tables[table]
        for name in (column, among):
            if name not in t.columns:
                raise ConfigError(f"{table} has no column {name!r}")
        order = [c.name for c in t.primary_key.columns]
        query = sql.SQL("SELECT * FROM {} WHERE {} = %s AND {} = ANY(%s) ORDER BY {}").format(
            sql.Identifier(self.schema, table),
            sql.Identifier(column),
            sql.Identifier(among),
            sql.SQL(", ").join(map(sql.Identifier, order)),
        )
        return self._fetch(query, (value, list(keys)))

    def payloads(self, positions: Sequence[int]) -> dict[int, bytes]:
        try:
            with self._pool.connection() as conn:
                return _payloads(conn, positions)
        except psycopg.Error as exc:
            raise translate(exc) from exc

    def _fetch(self, query: sql.Composed, params: tuple[Any, ...]) -> list[Row]:
        try:
            with self._pool.connection() as conn:
                cur = conn.cursor(row_factory=psycopg.rows.dict_row)
                return [dict(r) for r in cur.execute(query, params).fetchall()]
        except psycopg.Error as exc:
            raise translate(exc) from exc

    def create_schema(self) -> None:
        """Create this store's schema as empty copies of the live projection tables."""
        if self.schema == "public":
            raise ConfigError("refusing to recreate the live schema; pick a replay schema name")
        with self._pool.connection() as conn, conn.transaction():
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(self.schema)))
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(self.schema)))
            for name in [*self.tables, "gyre_checkpoints"]:
                conn.execute(
                    sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING ALL)").format(
                        sql.Identifier(self.schema, name), sql.Identifier("public", name)
                    )
                )
