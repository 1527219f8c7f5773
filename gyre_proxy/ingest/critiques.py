"""Evaluator critiques an execution asked for, so the proxy records them as what they are.

An execution may ask for an intermediate evaluation of its work; the critique comes back to
the harness as a tool's output, and the next request carries it as a tool result. A tool
result whose text is a critique of that execution is marked, so its tokens are recorded with
evaluator-critique provenance: context for the policy, never a training target. The proxy
knows an execution's critiques from its ``evaluation.recorded`` events of requested
evaluations, read from the log once per execution and when a new one is answered.
"""

from __future__ import annotations

import threading

import msgspec

from gyre_proxy.chat import ChatRequest, Message, ToolResultBlock
from gyre_store import EvaluationRecorded, EvaluationRequested, StreamId
from gyre_store.log import EventLog


class CritiqueBook:
    """Per execution, the critiques of the evaluations it requested; thread-safe."""

    def __init__(self, log: EventLog | None = None) -> None:
        self._log = log
        self._known: dict[str, frozenset[str]] = {}
        self._lock = threading.Lock()

    def refresh(self, execution_id: str) -> frozenset[str]:
        """Read the execution's requested evaluations and their critiques from the log."""
        found: set[str] = set()
        if self._log is not None:
            history = [r.event for r in self._log.read_stream(StreamId("evaluation", execution_id))]
            requested = {e.artifact_version for e in history if isinstance(e, EvaluationRequested)}
            found = {
                e.critique.strip()
                for e in history
                if isinstance(e, EvaluationRecorded)
                and e.artifact_version in requested
                and e.critique.strip()
            }
        with self._lock:
            self._known[execution_id] = frozenset(found)
        return self._known[execution_id]

    def known(self, execution_id: str) -> frozenset[str]:
        with self._lock:
            cached = self._known.get(execution_id)
        return cached if cached is not None else self.refresh(execution_id)

    def mark(self, execution_id: str, request: ChatRequest) -> ChatRequest:
        """``request`` with each tool result that is a known critique marked as one."""
        if not any(isinstance(b, ToolResultBlock) for m in request.messages for b in m.blocks):
            return request
        critiques = self.known(execution_id)
        if not critiques:
            return request
        changed = False
        messages: list[Message] = []
        for message in request.messages:
            blocks = []
            for block in message.blocks:
                if (
                    isinstance(block, ToolResultBlock)
                    and not block.critique
                    and block.content.strip() in critiques
                ):
                    block = msgspec.structs.replace(block, critique=True)
                    changed = True
                blocks.append(block)
            messages.append(msgspec.structs.replace(message, blocks=tuple(blocks)))
        return msgspec.structs.replace(request, messages=tuple(messages)) if changed else request
