"""Driver errors are split into the ones a retry may cure (the database away or busy) and the
refusals of what was sent, which fail the same way every time."""

from __future__ import annotations

import psycopg
import psycopg.errors
import pytest
from psycopg_pool import PoolTimeout

from gyre_store import GyreStoreError, StoreBusy, StoreUnavailable
from gyre_store.log.postgres import translate


@pytest.mark.parametrize(
    ("sqlstate", "kind"),
    [
        ("40001", StoreBusy),  # serialization failure
        ("40P01", StoreBusy),  # deadlock
        ("25006", StoreBusy),  # read-only transaction: a standby, just after a failover
        ("55P03", StoreBusy),  # lock not available
        ("53100", StoreBusy),  # disk full
        ("57014", StoreBusy),  # query cancelled
        ("08006", StoreUnavailable),  # connection failure
        ("57P01", StoreUnavailable),  # admin shutdown
        ("53300", StoreUnavailable),  # too many connections
        ("22P05", GyreStoreError),  # a NUL in a JSON string: this record, every time
        ("23502", GyreStoreError),  # not-null violation
        ("54000", GyreStoreError),  # program limit exceeded (an OperationalError to psycopg)
        ("42501", GyreStoreError),  # insufficient privilege
    ],
)
def test_sqlstates_are_translated_to_transient_or_permanent_errors(sqlstate: str, kind: type) -> None:
    error = translate(psycopg.errors.lookup(sqlstate)("from the server"))
    assert type(error) is kind
    assert isinstance(error, StoreUnavailable) == (kind is not GyreStoreError)


def test_client_side_connection_errors_are_unavailability() -> None:
    assert type(translate(psycopg.OperationalError("connection refused"))) is StoreUnavailable
    assert type(translate(PoolTimeout("no connection in 30 s"))) is StoreUnavailable
    assert type(translate(psycopg.ProgrammingError("the query has 2 placeholders"))) is GyreStoreError
