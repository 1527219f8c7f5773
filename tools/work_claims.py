"""Claims in Redis that share a run's work among its machines: which evaluator worker settles
which finished execution (``RedisEvaluationClaims``, the ``gyre_train.EvaluationClaims`` that
``gyre evaluator serve`` uses).

Key ``gyre:<run>:evaluation:<job>`` (``<run>``: the run's id and incarnation, so that a run of
the same id in another database never meets these keys) holds the taker's name and expires ``ttl_s`` after its last
renewal; once the outcome is recorded the taker sets it to ``done`` (kept for ``done_ttl_s``).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterable, Sequence

import redis

from gyre_train import CLAIM_DONE, CLAIM_UNKNOWN

# Renew only the claims this worker still holds (another may have taken an expired one over).
_RENEW = """
for i, key in ipairs(KEYS) do
    if redis.call('GET', key) == ARGV[1] then redis.call('PEXPIRE', key, ARGV[2]) end
end
return 0
"""


class RedisEvaluationClaims:
    """``EvaluationClaims`` on one Redis. A Redis error never stops the worker: a claim that
    cannot be taken is taken as held (the worker evaluates; outcomes are idempotent), and a
    state that cannot be read is ``CLAIM_UNKNOWN``."""

    def __init__(
        self, redis_url: str, run_id: str, worker: str, *, ttl_s: float = 30.0, done_ttl_s: float = 7 * 86400
    ) -> None:
        self.worker, self.ttl_s, self.done_ttl_s = worker, ttl_s, done_ttl_s
        self._client = redis.Redis.from_url(redis_url, socket_timeout=5.0, socket_connect_timeout=5.0)
        self._prefix = f"gyre:{run_id}:evaluation:"
        self._renewed = -math.inf

    def _key(self, job: str) -> str:
        return self._prefix + job

    def take(self, job: str) -> bool:
        try:
            return bool(self._client.set(self._key(job), self.worker, nx=True, px=int(self.ttl_s * 1000)))
        except redis.RedisError as exc:
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
        except redis.RedisError as exc:
            print(f"gyre evaluator: claims not renewed ({exc}); trying again", file=sys.stderr)

    def done(self, job: str) -> None:
        try:
            self._client.set(self._key(job), CLAIM_DONE, px=int(self.done_ttl_s * 1000))
        except redis.RedisError as exc:  # the claim expires; a worker that takes it over counts once
            print(f"gyre evaluator: {job} not marked done ({exc})", file=sys.stderr)

    def states(self, jobs: Sequence[str]) -> list[str | None]:
        if not jobs:
            return []
        try:
            values: Iterable[bytes | None] = self._client.mget([self._key(j) for j in jobs])  # type: ignore[assignment]
        except redis.RedisError:
            return [CLAIM_UNKNOWN] * len(jobs)
        return [v.decode() if v is not None else None for v in values]

    def close(self) -> None:
        self._client.close()
