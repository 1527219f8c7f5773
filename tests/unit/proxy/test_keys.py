"""API keys resolved from the log: issued elsewhere, found on a miss; revoked elsewhere, refused
once the recheck interval has passed."""

from __future__ import annotations

import asyncio

from gyre_proxy.service import StoreKeys, issue_key, revoke_key
from gyre_store import InMemoryEventLog


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
