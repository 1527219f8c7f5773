"""The LLM judge with a fake chat client: score parsing, what it is shown, what it records."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path

import httpx
import pytest

from gyre_store import EvaluationRecorded, EvaluationStatus, InMemoryEventLog, JudgeCalled, StreamId
from gyre_train import (
    ChatAnswer,
    ChatMessage,
    EvaluationConfig,
    EvaluationRunner,
    EvaluatorFailure,
    InvalidConfigError,
    JudgeEvaluator,
    OpenAIChatClient,
    PreservedState,
    RewardStatus,
    judge_messages,
    messages_digest,
    parse_score,
    read_workspace,
)
from tests.unit.train.runs import dispatch_group, finish, start

RUN = "run-judge"
RUBRIC = "The greeting must be written to hello.txt and say hello to the world."
PROMPT = "Write a greeting to hello.txt."


class FakeChat:
    """Answers from a list (an exception is raised instead); remembers what it was sent."""

    model = "judge-model"
    endpoint = "http://judge.test/v1/chat/completions"

    def __init__(self, *answers: str | Exception) -> None:
        self.answers = list(answers)
        self.sent: list[tuple[ChatMessage, ...]] = []

    def complete(self, messages: Sequence[ChatMessage], *, call_id: str = "") -> ChatAnswer:
        self.sent.append(tuple(messages))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return ChatAnswer(answer, "served-model", prompt_tokens=120, completion_tokens=30)

    def side_execution(self, call_id: str) -> str:
        return ""


def _workspace(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "hello.txt").write_text("hello, world\n")
    (root / "sub" / "notes.md").write_text("written by the agent\n")
    return root


def _state(location: Path | str, execution_id: str = "e0") -> PreservedState:
    return PreservedState(execution_id, RUN, "v1", ("refs/heads/main",), str(location))


def _judge(chat: FakeChat, log: InMemoryEventLog, **kw: object) -> JudgeEvaluator:
    return JudgeEvaluator(chat, log, judge="engine:pool", prompt=PROMPT, rubric=RUBRIC, task_id="t0", **kw)  # type: ignore[arg-type]


def _calls(log: InMemoryEventLog, execution_id: str = "e0") -> list[JudgeCalled]:
    return [
        r.event for r in log.read_stream(StreamId("judge", execution_id)) if isinstance(r.event, JudgeCalled)
    ]


# -- parsing ---------------------------------------------------------------------------------------


def test_the_score_line_is_read_and_the_rest_is_the_critique() -> None:
    assert parse_score("The file is there.\nIt greets the world.\nSCORE: 0.75\n") == (
        0.75,
        "The file is there.\nIt greets the world.",
    )
    assert parse_score("fine\n**SCORE: 1**") == (1.0, "fine")
    assert parse_score("<think>SCORE: 0.1 maybe</think>Good work.\nscore: .5") == (0.5, "Good work.")


def test_several_score_lines_take_the_last() -> None:
    score, critique = parse_score("SCORE: 0.2\nOn second thought, it is better.\nSCORE: 0.9")
    assert score == 0.9
    assert critique == "SCORE: 0.2\nOn second thought, it is better."


@pytest.mark.parametrize(
    "answer",
    ["SCORE: 1.5", "SCORE: -0.1", "SCORE: nan", "SCORE: 8/10", "SCORE: high", "Looks good to me.", ""],
)
def test_an_answer_without_a_score_in_range_is_a_failure(answer: str) -> None:
    with pytest.raises(EvaluatorFailure):
        parse_score(answer)


# -- what the judge is shown -----------------------------------------------------------------------


def test_binary_files_git_gyre_and_links_are_left_out_and_files_come_in_path_order(tmp_path: Path) -> None:
    root = _workspace(tmp_path / "ws")
    (root / "b.bin").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    (root / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))  # not UTF-8
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("[core]\n")
    (root / ".gyre").mkdir()
    (root / ".gyre" / "evaluate").write_text("#!/usr/bin/env python3\n")
    secret = tmp_path / "secret.txt"
    secret.write_text("the evaluator's key")
    (root / "a-link.txt").symlink_to(secret)
    (root / "linked-dir").symlink_to(tmp_path, target_is_directory=True)
    (root / "A.txt").write_text("capital\n")
    os.mkfifo(root / "pipe")  # never opened for a writer: reading it would block

    text = read_workspace(root)
    assert [f.path for f in text.shown] == ["A.txt", "hello.txt", "sub/notes.md"]
    assert text.binary == 2 and text.not_shown == ()
    _, user = judge_messages(PROMPT, RUBRIC, text)
    assert "the evaluator's key" not in user.content and "[core]" not in user.content


def test_the_budget_cuts_the_file_that_crosses_it_and_names_the_rest(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "a.txt").write_text("a" * 600)
    (root / "b.txt").write_text("é" * 2000)  # two bytes a character
    (root / "c.txt").write_text("c" * 10)

    text = read_workspace(root, budget_chars=1000)
    a, b = text.shown
    assert (a.path, a.text, a.truncated) == ("a.txt", "a" * 600, False)
    assert b.path == "b.txt" and b.truncated and 0 < len(b.text) < 2000 and set(b.text) == {"é"}
    assert b.size == 4000 and "truncated" in b.header
    assert sum(len(f.header) + len(f.text) for f in text.shown) == 1000
    assert text.not_shown == ("c.txt",)
    _, user = judge_messages(PROMPT, RUBRIC, text)
    assert "c.txt" in user.content and "c" * 10 not in user.content


def test_the_messages_hold_the_rules_the_prompt_the_rubric_and_the_files(tmp_path: Path) -> None:
    system, user = judge_messages(PROMPT, RUBRIC, read_workspace(_workspace(tmp_path / "ws")))
    assert (
        system.role == "system"
        and "rubric" in system.content
        and "SCORE: <number between 0 and 1>" in system.content
    )
    assert user.role == "user"
    for part in (
        PROMPT,
        RUBRIC,
        "=== hello.txt ===\nhello, world\n",
        "=== sub/notes.md ===\nwritten by the agent\n",
    ):
        assert part in user.content
    assert user.content.index(RUBRIC) < user.content.index("=== hello.txt ===")


# -- the evaluator ---------------------------------------------------------------------------------


def test_a_judged_workspace_is_scored_and_its_call_recorded(tmp_path: Path) -> None:
    log = InMemoryEventLog()
    chat = FakeChat("It writes the greeting.\nSCORE: 0.8")
    result = _judge(chat, log).evaluate(_state(_workspace(tmp_path / "ws")))

    assert (result.score, result.status, result.artifact_version) == (0.8, EvaluationStatus.VALID, "v1")
    assert result.critique == "It writes the greeting."
    [call] = _calls(log)
    assert result.detail == f"judge judge-model at engine:pool: 0.8 (call {call.call_id})"
    assert (call.execution_id, call.run_id, call.artifact_version, call.task_id) == ("e0", RUN, "v1", "t0")
    assert (call.judge, call.endpoint, call.model, call.served_model) == (
        "engine:pool",
        FakeChat.endpoint,
        "judge-model",
        "served-model",
    )
    assert call.messages_sha256 == messages_digest(chat.sent[0])
    assert call.rubric_sha256 == hashlib.sha256(RUBRIC.encode()).hexdigest()
    assert call.prompt_sha256 == hashlib.sha256(PROMPT.encode()).hexdigest()
    assert [(f.path, f.size, f.sent_chars, f.truncated) for f in call.files] == [
        ("hello.txt", 13, 13, False),
        ("sub/notes.md", 21, 21, False),
    ]
    assert (call.answer, call.score, call.error) == ("It writes the greeting.\nSCORE: 0.8", 0.8, "")
    assert (call.prompt_tokens, call.completion_tokens) == (120, 30)
    [recorded] = log.read(types=["judge.called"])
    assert recorded.metadata.run_id == RUN  # the run_id column an auditor filters on


def test_the_digest_is_of_the_messages_as_json(tmp_path: Path) -> None:
    messages = judge_messages(PROMPT, RUBRIC, read_workspace(_workspace(tmp_path / "ws")))
    wire = json.dumps(
        [{"role": m.role, "content": m.content} for m in messages], ensure_ascii=False, separators=(",", ":")
    )
    assert messages_digest(messages) == hashlib.sha256(wire.encode()).hexdigest()


def test_an_answer_without_a_score_is_recorded_then_raised(tmp_path: Path) -> None:
    log = InMemoryEventLog()
    judge = _judge(FakeChat("I cannot tell.", EvaluatorFailure("judge.test answered HTTP 503: busy")), log)
    with pytest.raises(EvaluatorFailure, match="no SCORE: line"):
        judge.evaluate(_state(_workspace(tmp_path / "ws")))
    with pytest.raises(EvaluatorFailure, match="HTTP 503"):
        judge.evaluate(_state(tmp_path / "ws"))
    first, second = _calls(log)
    assert (first.answer, first.score, first.error) == (
        "I cannot tell.",
        None,
        "the judge's answer has no SCORE: line",
    )
    assert (second.answer, second.score, second.error) == ("", None, "judge.test answered HTTP 503: busy")
    assert first.call_id != second.call_id


def test_any_client_error_is_recorded_as_a_failed_call(tmp_path: Path) -> None:
    log = InMemoryEventLog()
    with pytest.raises(EvaluatorFailure, match="RuntimeError: socket closed"):
        _judge(FakeChat(RuntimeError("socket closed")), log).evaluate(_state(_workspace(tmp_path / "ws")))
    [call] = _calls(log)
    assert call.error == "RuntimeError: socket closed" and call.score is None


def test_a_missing_workspace_is_not_evaluable_without_a_call(tmp_path: Path) -> None:
    log, chat = InMemoryEventLog(), FakeChat()
    for location in (tmp_path / "gone", ""):
        result = _judge(chat, log).evaluate(_state(location))
        assert (result.score, result.status) == (None, EvaluationStatus.NOT_EVALUABLE)
    assert chat.sent == [] and _calls(log) == []


def test_a_url_judge_is_recorded_without_its_credentials(tmp_path: Path) -> None:
    log = InMemoryEventLog()
    judge = JudgeEvaluator(
        FakeChat("SCORE: 0"),
        log,
        judge="https://user:secret@judge.test/v1?api-key=k",
        prompt=PROMPT,
        rubric=RUBRIC,
    )
    judge.evaluate(_state(_workspace(tmp_path / "ws")))
    [call] = _calls(log)
    assert call.judge == "https://judge.test/v1" and call.score == 0.0


def test_a_judge_needs_a_rubric() -> None:
    with pytest.raises(InvalidConfigError, match="no rubric"):
        JudgeEvaluator(FakeChat(), InMemoryEventLog(), judge="policy", prompt=PROMPT, rubric="  \n")


def test_the_runner_turns_the_judges_score_into_the_reward_and_its_answer_into_the_critique(
    tmp_path: Path,
) -> None:
    log = InMemoryEventLog()
    dispatch_group(log, RUN, "g0", ["e0"])
    start(log, "e0", RUN)
    finish(log, "e0", RUN)
    runner = EvaluationRunner(log, _judge(FakeChat("no score here", "Half of it.\nSCORE: 0.5"), log),
                              EvaluationConfig(retry_delay_s=0))  # fmt: skip
    runner.preserve("e0", "v1", location=str(_workspace(tmp_path / "ws")))
    outcome = runner.settle("e0", deadline=float("inf"))
    assert (outcome.status, outcome.reward, outcome.attempts) == (RewardStatus.VALID, 0.5, 2)
    [recorded] = [
        r.event
        for r in log.read_stream(StreamId("evaluation", "e0"))
        if isinstance(r.event, EvaluationRecorded)
    ]
    assert recorded.critique == "Half of it." and recorded.evaluator == "judge"
    assert [c.score for c in _calls(log)] == [None, 0.5]


# -- the OpenAI-compatible client ------------------------------------------------------------------


def test_the_client_speaks_chat_completions() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(
            200,
            json={
                "model": "served",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok\nSCORE: 1"}}],
                "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
            },
        )

    client = OpenAIChatClient(
        "http://judge.test/v1/", "sk-test", "m", max_tokens=64, transport=httpx.MockTransport(answer)
    )
    with client:
        got = client.complete([ChatMessage("system", "grade"), ChatMessage("user", "work")])
    assert got == ChatAnswer("ok\nSCORE: 1", "served", 7, 3)
    [request] = seen
    assert (request.method, str(request.url)) == ("POST", "http://judge.test/v1/chat/completions")
    assert request.headers["authorization"] == "Bearer sk-test"
    assert json.loads(request.content) == {
        "model": "m",
        "messages": [{"role": "system", "content": "grade"}, {"role": "user", "content": "work"}],
        "temperature": 0,
        "max_tokens": 64,
        "stream": False,
    }
    assert client.endpoint == "http://judge.test/v1/chat/completions" and client.model == "m"


@pytest.mark.parametrize(
    ("response", "reason"),
    [
        (httpx.Response(500, text="internal\nerror"), "answered HTTP 500: internal error"),
        (httpx.Response(200, text="not json"), "malformed completion"),
        (httpx.Response(200, json={"object": "chat.completion"}), "malformed completion"),
        (httpx.Response(200, json={"choices": []}), "answered no choices"),
        (httpx.Response(200, json={"choices": [{"message": {"content": None}}]}), "a choice without text"),
    ],
)
def test_the_client_turns_every_bad_answer_into_a_failure(response: httpx.Response, reason: str) -> None:
    client = OpenAIChatClient(
        "http://judge.test/v1", "", "m", transport=httpx.MockTransport(lambda _: response)
    )
    with client, pytest.raises(EvaluatorFailure, match=reason) as caught:
        client.complete([ChatMessage("user", "work")])
    assert "\n" not in str(caught.value)


def test_the_client_turns_a_connection_error_into_a_failure() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    client = OpenAIChatClient("http://judge.test/v1", "", "m", transport=httpx.MockTransport(refuse))
    reason = "cannot reach http://judge.test/v1/chat/completions: connection refused"
    with client, pytest.raises(EvaluatorFailure, match=re.escape(reason)):
        client.complete([ChatMessage("user", "work")])


def test_the_client_refuses_a_bad_configuration() -> None:
    with pytest.raises(InvalidConfigError):
        OpenAIChatClient("judge.test/v1", "", "m")
    with pytest.raises(InvalidConfigError):
        OpenAIChatClient("http://judge.test/v1", "", "")
