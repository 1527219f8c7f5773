"""The judge on the run's engines, against an in-memory log and a mock proxy: what each call
appends around its request, the key it sends, the routing slot of each setting, and how much
of a workspace fits the context."""

from __future__ import annotations

import hashlib
import json

import httpx
import pytest

from gyre_store import (
    ApiKeyIssued,
    ApiKeyRevoked,
    ExecutionFinished,
    ExecutionStarted,
    FinishReason,
    InMemoryEventLog,
)
from gyre_train import (
    ChatAnswer,
    ChatMessage,
    EngineJudgeClient,
    EvaluatorFailure,
    InvalidConfigError,
    context_budget_chars,
    is_judge_run,
    judge_run,
    judge_slot,
)

MESSAGES = [ChatMessage("system", "grade"), ChatMessage("user", "work")]


def _client(
    log: InMemoryEventLog, handler: httpx.MockTransport, url: str | None = "http://proxy:9"
) -> EngineJudgeClient:
    return EngineJudgeClient(log, "r~heldout-after", slot="pool", proxy_url=lambda: url, transport=handler)


def test_a_call_is_a_side_run_execution_with_a_key_of_its_own_revoked_when_done() -> None:
    log = InMemoryEventLog()
    sent: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        message = {"role": "assistant", "content": "fine\nSCORE: 1"}
        return httpx.Response(200, json={"model": "gyre-policy", "choices": [{"message": message}]})

    with _client(log, httpx.MockTransport(answer)) as client:
        got = client.complete(MESSAGES, call_id="c1")
    assert got == ChatAnswer("fine\nSCORE: 1", "gyre-policy")
    assert client.side_execution("c1") == "r~judge/c1"  # a side run's judge is its run's
    [request] = sent
    assert str(request.url) == "http://proxy:9/v1/chat/completions"
    assert json.loads(request.content)["messages"] == [
        {"role": "system", "content": "grade"},
        {"role": "user", "content": "work"},
    ]
    key = request.headers["authorization"].removeprefix("Bearer ")
    issued, started, finished, revoked = [r.event for r in log.read(0)]
    assert isinstance(issued, ApiKeyIssued) and issued.key_hash == hashlib.sha256(key.encode()).hexdigest()
    assert (issued.execution_id, issued.run_id) == ("r~judge/c1", "r~judge")
    assert isinstance(started, ExecutionStarted) and (started.engine, started.launcher) == ("pool", "judge")
    assert isinstance(finished, ExecutionFinished) and finished.reason is FinishReason.COMPLETED
    assert isinstance(revoked, ApiKeyRevoked) and revoked.key_hash == issued.key_hash


def test_a_failed_call_finishes_its_execution_as_failed_and_still_revokes_its_key() -> None:
    log = InMemoryEventLog()
    refuse = httpx.MockTransport(lambda _: httpx.Response(529, text="no engine is accepting requests"))
    with _client(log, refuse) as client, pytest.raises(EvaluatorFailure, match="answered HTTP 529"):
        client.complete(MESSAGES, call_id="c2")
    _, _, finished, revoked = [r.event for r in log.read(0)]
    assert isinstance(finished, ExecutionFinished) and finished.reason is FinishReason.FAILED
    assert "no engine is accepting requests" in finished.detail and isinstance(revoked, ApiKeyRevoked)


def test_no_registered_proxy_fails_the_call_before_anything_is_recorded() -> None:
    log = InMemoryEventLog()
    never = httpx.MockTransport(lambda _: pytest.fail("nothing may be sent"))
    with _client(log, never, url=None) as client, pytest.raises(EvaluatorFailure, match="not registered"):
        client.complete(MESSAGES, call_id="c3")
    assert log.read(0) == []


def test_settings_map_to_routing_slots_and_side_runs_are_recognised() -> None:
    assert judge_slot("policy", str) == "pool"
    assert judge_slot("engine:big", lambda name: f"r:ext-{name}") == "engine:r:ext-big"
    for bad in ("engine:", "https://judge/v1", "pool"):
        with pytest.raises(InvalidConfigError):
            judge_slot(bad, str)
    assert judge_run("r") == judge_run("r~heldout-before") == "r~judge"
    assert is_judge_run("r~judge") and not is_judge_run("r") and not is_judge_run("r~heldout-judge")


def test_the_workspace_share_leaves_the_fixed_text_and_the_answer_room_in_the_context() -> None:
    prompt, rubric = "p" * 300, "r" * 200
    small = context_budget_chars(4096, 160, prompt, rubric)
    assert small == context_budget_chars(4096, 160, "", "") - 500
    assert context_budget_chars(8192, 160, prompt, rubric) == small + 4096
    assert context_budget_chars(1024, 512, prompt, rubric) == 1000  # never below the judge's minimum
