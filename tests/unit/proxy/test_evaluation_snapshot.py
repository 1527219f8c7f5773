"""An execution's ask for an evaluation names its own snapshot, and nothing else.

The evaluator reads the location an ask names, so the gateway holds it against the folder the
launcher recorded for the execution (``execution.started``): an ask naming a foreign folder,
a path climbing out of the snapshots folder, or a snapshot that is a link elsewhere is refused
with ``SnapshotRefused`` and recorded as ``evaluation.refused``. Nothing is preserved or asked of
the evaluator, so nothing of the foreign folder is read; the execution's next, proper ask is
answered.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gyre_proxy.chat import EvaluationAsked, ExecutionAuth
from gyre_proxy.exceptions import SnapshotRefused
from gyre_proxy.ingest import CritiqueBook
from gyre_proxy.service.evaluations import LogEvaluations
from gyre_store import (
    ArtifactPreserved,
    EvaluationRecorded,
    EvaluationRefused,
    EvaluationRequested,
    EvaluationStatus,
    ExecutionStarted,
    NewEvent,
    StreamId,
)
from gyre_store.testing import InMemoryEventLog

EXECUTION = ExecutionAuth(execution_id="e0", run_id="r0", harness="builtin")
VERSION = "wip-0123456789ab"


def gateway(tmp_path: Path, *, folder: bool = True) -> tuple[InMemoryEventLog, LogEvaluations, Path]:
    log = InMemoryEventLog()
    own = tmp_path / "ws" / "e0"
    (own / "snapshots" / VERSION).mkdir(parents=True)
    started = ExecutionStarted(execution_id="e0", run_id="r0", engine="x", folder=str(own) if folder else "")
    answered = EvaluationRecorded(
        evaluation_id="v0", execution_id="e0", run_id="r0", attempt=0, evaluator="tests",
        artifact_version=VERSION, status=EvaluationStatus.VALID, score=0.5,
    )  # fmt: skip
    log.append([NewEvent(started), NewEvent(answered)])
    return log, LogEvaluations(log, CritiqueBook(log), timeout_s=0.5, poll_s=0.05), own


def asked_of(log: InMemoryEventLog) -> list[object]:
    """What the evaluator would act on: preserved artifacts and evaluation requests."""
    events = [r.event for s in ("artifact", "evaluation") for r in log.read_stream(StreamId(s, "e0"))]
    return [e for e in events if isinstance(e, ArtifactPreserved | EvaluationRequested)]


def refusals(log: InMemoryEventLog) -> list[EvaluationRefused]:
    events = [r.event for r in log.read_stream(StreamId("evaluation", "e0"))]
    return [e for e in events if isinstance(e, EvaluationRefused)]


def test_an_ask_naming_a_foreign_folder_is_refused_and_recorded(tmp_path: Path) -> None:
    log, evaluations, own = gateway(tmp_path)
    foreign = tmp_path / "host-secrets"
    foreign.mkdir()
    (foreign / "key.txt").write_text("secret\n")
    with pytest.raises(SnapshotRefused, match="not this execution's snapshot"):
        asyncio.run(evaluations.evaluate(EXECUTION, EvaluationAsked(VERSION, str(foreign))))
    assert asked_of(log) == []  # nothing for the evaluator to read
    [refused] = refusals(log)
    assert refused.location == str(foreign) and refused.artifact_version == VERSION

    # The execution goes on: its own snapshot is evaluated, at the path the run recorded.
    answer = asyncio.run(
        evaluations.evaluate(EXECUTION, EvaluationAsked(VERSION, str(own / "snapshots" / VERSION)))
    )
    assert answer.score == 0.5
    [preserved] = [e for e in asked_of(log) if isinstance(e, ArtifactPreserved)]
    assert preserved.location == str((own / "snapshots" / VERSION).resolve())


def test_paths_that_climb_or_link_out_of_the_snapshots_are_refused(tmp_path: Path) -> None:
    log, evaluations, own = gateway(tmp_path)
    foreign = tmp_path / "host-secrets"
    foreign.mkdir()
    linked = "wip-linked"
    (own / "snapshots" / linked).symlink_to(foreign)
    for version, location in [
        (VERSION, f"{own}/snapshots/../../../host-secrets"),  # climbs out
        (linked, str(own / "snapshots" / linked)),  # the snapshot is a link to the foreign folder
        ("..", str(own / "snapshots" / "..")),  # a version that is no snapshot name
        (VERSION, f"snapshots/{VERSION}"),  # relative: names nothing the run recorded
        (VERSION, str(own / "workspace")),  # the live workspace is no snapshot
    ]:
        with pytest.raises(SnapshotRefused):
            asyncio.run(evaluations.evaluate(EXECUTION, EvaluationAsked(version, location)))
    assert asked_of(log) == []
    assert len(refusals(log)) == 5


def test_an_execution_without_a_recorded_folder_is_refused(tmp_path: Path) -> None:
    log, evaluations, own = gateway(tmp_path, folder=False)
    with pytest.raises(SnapshotRefused, match="no folder"):
        asyncio.run(
            evaluations.evaluate(EXECUTION, EvaluationAsked(VERSION, str(own / "snapshots" / VERSION)))
        )
    assert asked_of(log) == []
