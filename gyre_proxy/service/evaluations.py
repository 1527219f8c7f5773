"""The evaluation gateway on the log: an execution's ask recorded, the evaluator's answer awaited.

An ask records the artifact the execution preserved (``artifact.preserved``) and the request
(``evaluation.requested``); an evaluator worker of the run evaluates that artifact and records
``evaluation.recorded`` (or ``evaluation.failed``). The gateway waits for it by re-reading the
execution's evaluation stream, tells the critique book, and answers. Asking twice about one
artifact records nothing new and returns the same answer.

The evaluator reads what the ask names, so the ask may name one place only: the snapshot
``<folder>/snapshots/<artifact_version>``, where ``folder`` is the execution's folder as its
launcher recorded it (``execution.started``). An ask naming anything else (another folder,
a path through a link out of the snapshots folder, an execution without a recorded folder)
is refused before anything is read: ``evaluation.refused`` is recorded and the execution gets
``SnapshotRefused`` as its answer, and goes on.
"""

from __future__ import annotations

import asyncio
import os
import re
import time

from gyre_proxy.answer import ExecutionSync
from gyre_proxy.chat import EvaluationAnswer, EvaluationAsked, ExecutionAuth
from gyre_proxy.exceptions import InvalidRequest, Overloaded, SnapshotRefused
from gyre_proxy.ingest import CritiqueBook
from gyre_store import (
    ArtifactPreserved,
    EvaluationFailed,
    EvaluationRecorded,
    EvaluationRefused,
    EvaluationRequested,
    ExecutionStarted,
    NewEvent,
    StreamId,
)
from gyre_store.log import EventLog, EventMetadata

SNAPSHOTS = "snapshots"  # the folder of an execution's snapshots, in the execution's folder
_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")  # one plain file name


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
        location = await asyncio.to_thread(self._snapshot, execution, version, asked.location)
        preserved = ArtifactPreserved(
            execution_id=eid, run_id=execution.run_id, artifact_version=version, location=location
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

    def _snapshot(self, execution: ExecutionAuth, version: str, location: str) -> str:
        """The snapshot folder the run recorded for ``execution`` and ``version``, which
        ``location`` must name; otherwise the ask is recorded refused and SnapshotRefused raised."""
        folder = self._folder(execution.execution_id)
        snapshot = ""
        if not folder:
            reason = "the run recorded no folder for this execution"
        elif not _VERSION.fullmatch(version) or version in {".", ".."}:
            reason = "the artifact version is not a plain snapshot name"
        else:
            # The snapshots folder itself resolved (the run's folder may lie behind a link),
            # the snapshot not: a snapshot that is a link, or a location that leads elsewhere
            # through one, does not name it.
            snapshot = os.path.join(os.path.realpath(os.path.join(folder, SNAPSHOTS)), version)
            named = os.path.realpath(location) if os.path.isabs(location) else ""
            reason = (
                ""
                if named == snapshot and not os.path.islink(snapshot)
                else f"the location is not this execution's snapshot {snapshot}"
            )
        if not reason:
            return snapshot
        refused = EvaluationRefused(
            execution_id=execution.execution_id,
            run_id=execution.run_id,
            artifact_version=version[:200],
            location=location[:1000],
            reason=reason,
        )
        self.log.append([NewEvent(refused, metadata=EventMetadata(run_id=execution.run_id))])
        raise SnapshotRefused(f"evaluation refused: {reason}")

    def _folder(self, execution_id: str) -> str:
        """The execution's folder as its launcher recorded it ("" if none was)."""
        for recorded in reversed(self.log.read_stream(StreamId("execution", execution_id))):
            if isinstance(recorded.event, ExecutionStarted) and recorded.event.folder:
                return recorded.event.folder
        return ""

    def _answer(self, execution_id: str, version: str) -> EvaluationAnswer | None:
        for recorded in reversed(self.log.read_stream(StreamId("evaluation", execution_id))):
            event = recorded.event
            if isinstance(event, EvaluationRecorded) and event.artifact_version == version:
                return EvaluationAnswer(event.status.value, event.score, event.critique)
            if isinstance(event, EvaluationFailed) and event.artifact_version == version:
                return EvaluationAnswer("failed", None, event.detail)
        return None
