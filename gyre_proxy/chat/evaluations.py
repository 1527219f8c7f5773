"""The seam through which an execution asks for an evaluation of its current work.

A command in the execution's workspace preserves the work it has (an artifact version and
where the copy lives) and posts it with the execution's own key; the gateway records the
request, waits for the evaluator's answer and returns it. What runs the evaluation is not
the proxy's business: it only carries the request and the answer.
"""

from __future__ import annotations

from typing import Protocol

import msgspec

from gyre_proxy.chat.answerer import ExecutionAuth


class EvaluationAsked(msgspec.Struct, frozen=True):
    """What the command posts: the artifact it preserved, and where it lies."""

    artifact_version: str
    location: str


class EvaluationAnswer(msgspec.Struct, frozen=True):
    """The evaluator's answer: its status, its score (None unless valid) and its critique."""

    status: str
    score: float | None
    critique: str


class EvaluationGateway(Protocol):
    async def evaluate(self, execution: ExecutionAuth, asked: EvaluationAsked) -> EvaluationAnswer:
        """Raises ``InvalidRequest`` for a malformed ask, ``Overloaded`` when no answer came in time."""
        ...
