"""Event type of an LLM judge's call: what it was shown, what it answered, what it scored.

A judge scores an execution's preserved workspace against its task's rubric by asking a
model. Every call, answered or failed, is one ``judge.called`` event on the execution's
``judge`` stream, so an auditor reads in SQL which model saw what and said what. The
messages are not stored, only their sha256 and the list of files they showed: the workspace
is the preserved artifact, and the judge rebuilds the same messages from it. The judge
itself lives in gyre_train; this module only defines what is recorded.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from gyre_store.catalog.registry import REGISTRY, Ident, NonNegative
from gyre_store.log import Event

Sha256 = Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{64}$")]


class JudgedFile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One workspace file whose text a judge was shown: ``sent_chars`` of it, all or a prefix."""

    path: str
    size: NonNegative  # bytes on disk
    sent_chars: NonNegative
    truncated: bool = False  # only the first ``sent_chars`` characters were shown


@REGISTRY.register("judge.called", stream="judge", key="execution_id")
class JudgeCalled(Event, frozen=True, kw_only=True):
    """One call of an LLM judge about one preserved artifact of an execution, and its answer.

    ``judge`` is the configured setting (``policy``, ``engine:NAME`` or a URL), ``endpoint``
    where the call went and ``model`` the model asked for (``served_model``: the one that
    answered, as the server reported it). ``messages_sha256`` is the sha256 of the messages
    as sent (their JSON, see ``gyre_train.rewards.judge.messages_digest``); ``rubric_sha256``
    and ``prompt_sha256`` those of the rubric and the task prompt in them. ``answer`` is the
    model's whole text, ``score`` the score read from it (None: the call failed, or its
    answer held no usable score, and ``error`` says why). A judge on the run's own engines
    (``policy``, ``engine:NAME``) makes each call as an execution of the side run
    ``<run>~judge``, ``side_execution``, whose model calls the proxy records like any other
    (never in a rollout group, so never trained on); a URL judge leaves it empty.
    """

    call_id: Ident  # unique per call attempt
    execution_id: Ident
    run_id: Ident
    artifact_version: Ident
    task_id: str = ""
    judge: str
    endpoint: str = ""
    model: str
    served_model: str = ""
    messages_sha256: Sha256
    rubric_sha256: Sha256
    prompt_sha256: Sha256
    files: tuple[JudgedFile, ...] = ()
    files_not_shown: NonNegative = 0  # files past the character budget: named at most, not shown
    binary_files: NonNegative = 0  # files skipped as binary (not UTF-8 text)
    answer: str = ""
    score: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] | None = None
    seconds: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    prompt_tokens: NonNegative | None = None
    completion_tokens: NonNegative | None = None
    error: str = ""
    side_execution: str = ""


def judge_call_key(call_id: str) -> str:
    """The idempotency key of one judge call: appending the same call twice records it once."""
    return f"judge.called:{call_id}"
