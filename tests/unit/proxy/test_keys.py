"""API keys resolved from the log: issued elsewhere, found on a miss; revoked elsewhere, refused
once the recheck interval has passed."""

from __future__ import annotations

import asyncio

import pytest

from gyre_proxy.service import StoreKeys, issue_key, revoke_key
from gyre_store import InMemoryEventLog, StoreUnavailable


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_key_revoked_by_another_writer_is_refused_after_the_recheck_interval() -> None:
    log = InMemoryEventLog()
    clock = _Clock()
    keys = StoreKeys(log, recheck_s=1.0, clock=clock)
    key = issue_key(log, execution_id="ex", run_id="run", harness="claude-code")
    auth = asyncio.run(keys.resolve(key))
    assert auth is not None and auth.execution_id == "ex"
    revoke_key(log, key)  # written to the log, as another process would
    clock.now = 0.5
    assert asyncio.run(keys.resolve(key)) == auth  # still inside the interval: answered from memory
    clock.now = 1.6
    assert asyncio.run(keys.resolve(key)) is None
    assert keys.resolve_sync(key) is None


def test_a_key_issued_after_the_last_read_is_found_at_once() -> None:
    log = InMemoryEventLog()
    keys = StoreKeys(log, recheck_s=60.0, clock=_Clock())
    assert asyncio.run(keys.resolve("gyre-unknown")) is None
    key = issue_key(log, execution_id="ex2", run_id="run", harness="openai")
    auth = keys.resolve_sync(key)
    assert auth is not None and auth.harness == "openai"


class _CommitsBetween(InMemoryEventLog):
    """A log where another process's key lands just after a read that found nothing (before
    the reader asks for the head): the interleaving that lost a key in a live run."""

    def __init__(self) -> None:
        super().__init__()
        self.arm = False

    def read(self, after: int, **kwargs: object):  # type: ignore[no-untyped-def, override]
        events = super().read(after, **kwargs)  # type: ignore[arg-type]
        if self.arm and not events:
            self.arm = False
            self.key = issue_key(self, execution_id="late", run_id="run", harness="builtin")
        return events


def test_a_key_issued_while_the_log_is_read_is_not_skipped() -> None:
    log = _CommitsBetween()
    keys = StoreKeys(log, recheck_s=60.0, clock=_Clock())
    issue_key(log, execution_id="first", run_id="run", harness="builtin")
    log.arm = True
    assert keys.resolve_sync("gyre-unknown") is None  # the read that finds nothing; a key lands
    auth = keys.resolve_sync(log.key)
    assert auth is not None and auth.execution_id == "late"


class _Outage(InMemoryEventLog):
    """A log that can be made unreadable, as a database outage makes it."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False

    def head(self) -> int:
        if self.down:
            raise StoreUnavailable("the database is down")
        return super().head()


def test_a_known_key_is_answered_from_memory_while_the_store_is_down() -> None:
    log = _Outage()
    clock = _Clock()
    keys = StoreKeys(log, recheck_s=1.0, clock=clock)
    key = issue_key(log, execution_id="ex", run_id="run", harness="claude-code")
    auth = keys.resolve_sync(key)
    assert auth is not None
    log.down = True
    clock.now = 5.0  # past the recheck: the read fails, the known key still resolves
    assert asyncio.run(keys.resolve(key)) == auth
    assert keys.stale_answers == 1
    # A key this proxy never saw cannot be vouched for: the outage is the caller's error.
    with pytest.raises(StoreUnavailable):
        keys.resolve_sync("gyre-never-issued")
    # Once the store answers, a revocation recorded meanwhile takes effect.
    log.down = False
    revoke_key(log, key)
    clock.now = 10.0
    assert keys.resolve_sync(key) is None
