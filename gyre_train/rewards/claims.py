"""Evaluations shared by the evaluator workers of a run, on several machines: a worker
evaluates an execution only once it holds that execution's claim (``EvaluationClaims``; on
Redis: ``gyre_tools.work_claims.RedisEvaluationClaims``).

A claim expires unless its taker renews it while it evaluates; once the outcome is recorded the
taker marks the job ``done``. A worker that finds a job taken waits: the job is dropped once it
is done, and taken over once the claim is gone (its taker died, or lost its machine, and stopped
renewing). Outcomes are idempotent per execution, so a job evaluated twice (a taker cut off
from the claims for longer than their expiry) is counted once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

CLAIM_DONE = "done"
CLAIM_UNKNOWN = "?"  # the claims did not answer: the job is neither taken over nor dropped


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
        """Per job: ``CLAIM_DONE``, the taker's name, None when nobody holds it, or ``CLAIM_UNKNOWN``."""
        ...
