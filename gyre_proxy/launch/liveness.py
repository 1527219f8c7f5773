"""Which launchers of a run are alive: each renews a key of its own in Redis that expires after
``ttl_s``; a launcher whose key has expired is taken as lost with its host, and another
launcher finishes the executions it had started (``Launcher``).
"""

from __future__ import annotations

import math
import sys
import time
from typing import Protocol

import redis


class Liveness(Protocol):
    """A launcher's heartbeat, and whether another launcher of the run still beats."""

    def beat(self) -> None: ...

    def alive(self, name: str) -> bool | None:
        """True or False, or None when it cannot be told now (then nobody is taken as lost)."""
        ...


class RedisLiveness:
    """``Liveness`` on one Redis: key ``gyre:<run>:launcher:<name>``, set to expire after
    ``ttl_s`` and renewed every ``ttl_s / 3``. Redis errors never stop the launcher: a beat that
    fails is tried again on the next step, and a launcher whose key cannot be read is not
    taken as lost."""

    def __init__(self, redis_url: str, run_id: str, name: str, *, ttl_s: float = 30.0) -> None:
        self.ttl_s = ttl_s
        self._client = redis.Redis.from_url(redis_url, socket_timeout=5.0, socket_connect_timeout=5.0)
        self._prefix = f"gyre:{run_id}:launcher:"
        self._name = name
        self._last = -math.inf

    def beat(self) -> None:
        now = time.monotonic()
        if now - self._last < self.ttl_s / 3:
            return
        try:
            self._client.set(self._prefix + self._name, str(time.time()), px=int(self.ttl_s * 1000))
            self._last = now
        except redis.RedisError as exc:
            print(f"gyre launcher: heartbeat not renewed ({exc}); trying again", file=sys.stderr)

    def alive(self, name: str) -> bool | None:
        try:
            return bool(self._client.exists(self._prefix + name))
        except redis.RedisError:
            return None

    def close(self) -> None:
        self._client.close()
