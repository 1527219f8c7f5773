"""The evaluation gateway on the log: an execution's ask recorded, the evaluator's answer awaited.

An ask records the artifact the execution preserved (``artifact.preserved``) and the request
(``evaluation.requested``); an evaluator worker of the run evaluates that artifact and records
``evaluation.recorded`` (or ``evaluation.failed``). The gateway waits for it by re-reading the
execution's evaluation stream, tells the critique book, and answers. Asking twice about one
artifact records nothing new and returns the same answer.
"""

from __future__ import annotations

import asyncio
import time

from gyre_proxy.answer import ExecutionSync
from gyre_proxy.chat import EvaluationAnswer, EvaluationAsked, ExecutionAuth
from gyre_proxy.exceptions import InvalidRequest, Overloaded
from gyre_proxy.ingest import CritiqueBook
from gyre_store import (
    ArtifactPreserved,
    EvaluationFailed,
    EvaluationRecorded,
    EvaluationRequested,
    NewEvent,
    StreamId,
)
from gyre_store.log import EventLog, EventMetadata


class LogEvaluations:
    """``EvaluationGateway`` over the event log."""

    def __init__(
        self,
        log: EventLog,
        critiques: CritiqueBook,
        *,
        timeout_s: float = 120.0,
        poll_s: float = 0.2,
        sync: ExecutionSync | None = None,
    ):
        self.log = log
        self.critiques = critiques
        # With several workers: a critique this one learnt must reach the others' books too, so
        # it counts as a change to the execution (already in the log) that makes them reload.
        self.sync = sync
        self.timeout_s = timeout_s
        self.poll_s = poll_s

    async def evaluate(self, execution: ExecutionAuth, asked: EvaluationAsked) -> EvaluationAnswer:
        version = asked.artifact_version.strip()
        if not version or not asked.location.strip():
            raise InvalidRequest(
                "an evaluation needs the artifact_version and the location of the preserved work"
            )
        eid, meta = execution.execution_id, EventMetadata(run_id=execution.run_id)
        preserved = ArtifactPreserved(
            execution_id=eid, run_id=execution.run_id, artifact_version=version, location=asked.location
        )
        requested = EvaluationRequested(execution_id=eid, run_id=execution.run_id, artifact_version=version)
        await asyncio.to_thread(
            self.log.append,
            [
                NewEvent(preserved, f"artifact:{eid}:{version}", metadata=meta),
                NewEvent(requested, f"evaluation.requested:{eid}:{version}", metadata=meta),
            ],
        )
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            answer = await asyncio.to_thread(self._answer, eid, version)
            if answer is not None:
                await asyncio.to_thread(self.critiques.refresh, eid)
                if self.sync is not None:
                    self.sync.staged(eid)
                    self.sync.written(eid)
                return answer
            await asyncio.sleep(self.poll_s)
        raise Overloaded(f"no evaluation of artifact {version} within {self.timeout_s:g} s; ask again later")

    def _answer(self, execution_id: str, version: str) -> EvaluationAnswer | None:
        for recorded in reversed(self.log.read_stream(StreamId("evaluation", execution_id))):
            event = recorded.event
            if isinstance(event, EvaluationRecorded) and event.artifact_version == version:
                return EvaluationAnswer(event.status.value, event.score, event.critique)
            if isinstance(event, EvaluationFailed) and event.artifact_version == version:
                return EvaluationAnswer("failed", None, event.detail)
        return None
