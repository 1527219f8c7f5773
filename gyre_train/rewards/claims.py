"""Evaluations shared by the evaluator workers of a run, on several machines: a worker
evaluates an execution only once it holds that execution's claim in Redis.

Key ``gyre:<run>:evaluation:<job>`` holds the taker's name and expires ``ttl_s`` after its last
renewal; the taker renews its claims while it evaluates and, once the outcome is recorded, sets
the key to ``done`` (kept for ``done_ttl_s``). A worker that finds a job taken waits: the job
is dropped once it is done, and taken over once the key is gone (its taker died, or lost its
machine, and stopped renewing). Outcomes are idempotent per execution, so a job evaluated
twice (a taker that lost Redis for longer than ``ttl_s``) is counted once.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Protocol

DONE = "done"
UNKNOWN = "?"  # Redis did not answer: the job is neither taken over nor dropped

# Renew only the claims this worker still holds (another may have taken an expired one over).
_RENEW = """
for i, key in ipairs(KEYS) do
    if redis.call('GET', key) == ARGV[1] then redis.call('PEXPIRE', key, ARGV[2]) end
end
return 0
"""


class EvaluationClaims(Protocol):
    """Who evaluates which job of a run, among its evaluator workers."""

    def take(self, job: str) -> bool:
        """Claim ``job``; False when another worker holds it or has done it."""
        ...

    def renew(self, jobs: Sequence[str]) -> None:
        """Keep this worker's claims on ``jobs`` from expiring."""
        ...

    def done(self, job: str) -> None:
        """``job``'s outcome is recorded: nobody takes it again."""
        ...

    def states(self, jobs: Sequence[str]) -> list[str | None]:
        """Per job: ``DONE``, the taker's name, None when nobody holds it, or ``UNKNOWN``."""
        ...


class RedisEvaluationClaims:
    """``EvaluationClaims`` on one Redis. A Redis error never stops the worker: a claim that
    cannot be taken is taken as held (the worker evaluates; outcomes are idempotent), and a
    state that cannot be read is ``UNKNOWN``."""

    def __init__(
        self, redis_url: str, run_id: str, worker: str, *, ttl_s: float = 30.0, done_ttl_s: float = 7 * 86400
    ) -> None:
        import redis  # here, not at import: gyre_train loads no client of a server it may not use

        self.worker, self.ttl_s, self.done_ttl_s = worker, ttl_s, done_ttl_s
        self._error = redis.RedisError
        self._client = redis.Redis.from_url(redis_url, socket_timeout=5.0, socket_connect_timeout=5.0)
        self._prefix = f"gyre:{run_id}:evaluation:"
        self._renewed = -math.inf

    def _key(self, job: str) -> str:
        return self._prefix + job

    def take(self, job: str) -> bool:
        try:
            return bool(self._client.set(self._key(job), self.worker, nx=True, px=int(self.ttl_s * 1000)))
        except self._error as exc:
            print(f"gyre evaluator: claim of {job} not taken ({exc}); evaluating anyway", file=sys.stderr)
            return True

    def renew(self, jobs: Sequence[str]) -> None:
        now = time.monotonic()
        if not jobs or now - self._renewed < self.ttl_s / 3:
            return
        try:
            keys = [self._key(j) for j in jobs]
            self._client.eval(_RENEW, len(keys), *keys, self.worker, int(self.ttl_s * 1000))
            self._renewed = now
        except self._error as exc:
            print(f"gyre evaluator: claims not renewed ({exc}); trying again", file=sys.stderr)

    def done(self, job: str) -> None:
        try:
            self._client.set(self._key(job), DONE, px=int(self.done_ttl_s * 1000))
        except self._error as exc:  # the claim expires; a worker that takes it over counts once
            print(f"gyre evaluator: {job} not marked done ({exc})", file=sys.stderr)

    def states(self, jobs: Sequence[str]) -> list[str | None]:
        if not jobs:
            return []
        try:
            values: Iterable[bytes | None] = self._client.mget([self._key(j) for j in jobs])  # type: ignore[assignment]
        except self._error:
            return [UNKNOWN] * len(jobs)
        return [v.decode() if v is not None else None for v in values]

    def close(self) -> None:
        self._client.close()
