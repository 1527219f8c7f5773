"""The LLM judge against a real OpenAI-compatible HTTP server on loopback and real PostgreSQL.

The judge scores a workspace through ``/v1/chat/completions``; every call, answered or failed,
is a ``judge.called`` event that the SQL of docs/judge.md returns with the evaluation it became;
the judge's critique reaches ``evaluation.recorded`` and, for an evaluation the execution asked
for, the proxy's critique book (which records it with critique provenance).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import pytest

from gyre_proxy.ingest import CritiqueBook
from gyre_store import (
    EvaluationRecorded,
    EvaluationRequested,
    JudgeCalled,
    NewEvent,
    PostgresEventLog,
    StreamId,
)
from gyre_train import (
    ChatMessage,
    EvaluationConfig,
    EvaluationRunner,
    EvaluatorFailure,
    InvalidEvaluationError,
    JudgeEvaluator,
    OpenAIChatClient,
    PreservedState,
    RewardStatus,
    messages_digest,
)
from tests.unit.train.runs import dispatch_group, finish, start

DOC = Path(__file__).resolve().parents[3] / "docs" / "judge.md"
RUN = "judge-run"  # the run the documented query names
RUBRIC = "hello.txt must greet the world by name."
PROMPT = "Write a greeting to hello.txt."
ANSWER = "hello.txt greets the world, but without a name.\nSCORE: 0.6"


@dataclass
class JudgeServer:
    """A stdlib HTTP server answering chat completions with ``status`` and ``answer``."""

    url: str
    status: int = 200
    answer: str = ANSWER
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)


@pytest.fixture
def server() -> Iterator[JudgeServer]:
    state = JudgeServer(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state.requests.append(body)
            state.headers.append(dict(self.headers))
            if self.path != "/v1/chat/completions":
                self._send(404, {"error": {"message": f"no route {self.path}"}})
            elif state.status != 200:
                self._send(state.status, {"error": {"message": "the judge fell over"}})
            else:
                choice = {"index": 0, "message": {"role": "assistant", "content": state.answer}}
                usage = {"prompt_tokens": 321, "completion_tokens": 12}
                self._send(200, {"model": "judge-served", "choices": [choice], "usage": usage})

        def _send(self, status: int, payload: object) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:  # quiet
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def _documented_query() -> str:
    found = dict(re.findall(r"```sql\n-- audit: (\S+)\n(.*?)```", DOC.read_text(), flags=re.S))
    return found["judge-calls"]


def _closed_execution(log: PostgresEventLog, execution_id: str, workspace: Path) -> Path:
    dispatch_group(log, RUN, f"g-{execution_id}", [execution_id])
    start(log, execution_id, RUN)
    finish(log, execution_id, RUN)
    workspace.mkdir()
    (workspace / "hello.txt").write_text("hello, world\n")
    return workspace


def _judge(client: OpenAIChatClient, log: PostgresEventLog, url: str) -> JudgeEvaluator:
    return JudgeEvaluator(client, log, judge=url, prompt=PROMPT, rubric=RUBRIC, task_id="greet")


def test_the_judge_scores_a_workspace_and_the_documented_sql_returns_its_call(
    pg_log: PostgresEventLog, database_url: str, server: JudgeServer, tmp_path: Path
) -> None:
    workspace = _closed_execution(pg_log, "j-e0", tmp_path / "ws")
    with OpenAIChatClient(server.url, "sk-judge", "judge-model", timeout_s=30, max_tokens=256) as client:
        runner = EvaluationRunner(
            pg_log, _judge(client, pg_log, server.url), EvaluationConfig(retry_delay_s=0)
        )
        runner.preserve("j-e0", "v1", location=str(workspace))
        outcome = runner.settle("j-e0", deadline=float("inf"))
    assert (outcome.status, outcome.reward) == (RewardStatus.VALID, 0.6)

    [request] = server.requests
    assert server.headers[0]["Authorization"] == "Bearer sk-judge"
    assert (request["model"], request["temperature"], request["stream"], request["max_tokens"]) == (
        "judge-model",
        0,
        False,
        256,
    )
    assert RUBRIC in request["messages"][1]["content"] and "hello, world" in request["messages"][1]["content"]

    [call] = [
        r.event for r in pg_log.read_stream(StreamId("judge", "j-e0")) if isinstance(r.event, JudgeCalled)
    ]
    sent = [ChatMessage(m["role"], m["content"]) for m in request["messages"]]
    assert call.messages_sha256 == messages_digest(sent)  # the digest is of what the server received
    assert (call.answer, call.score, call.served_model, call.prompt_tokens) == (
        ANSWER,
        0.6,
        "judge-served",
        321,
    )
    assert call.endpoint == f"{server.url}/chat/completions"

    with psycopg.connect(database_url) as conn:
        rows = conn.execute(_documented_query()).fetchall()  # type: ignore[call-overload]
    assert [row[1:] for row in rows] == [
        (
            "j-e0",
            "v1",
            server.url,
            "judge-model",
            0.6,
            "",
            call.messages_sha256,
            1,
            "evaluation.recorded",
            "j-e0:1",
            0.6,
        )
    ]


def test_a_failing_judge_server_is_a_recorded_failed_call(
    pg_log: PostgresEventLog, database_url: str, server: JudgeServer, tmp_path: Path
) -> None:
    workspace = _closed_execution(pg_log, "j-e1", tmp_path / "ws")
    server.status = 500
    with OpenAIChatClient(server.url, "", "judge-model", timeout_s=30) as client:
        judge = _judge(client, pg_log, server.url)
        with pytest.raises(EvaluatorFailure, match="answered HTTP 500"):
            judge.evaluate(PreservedState("j-e1", RUN, "v1", (), str(workspace)))
        runner = EvaluationRunner(pg_log, judge, EvaluationConfig(retry_delay_s=0))
        runner.preserve("j-e1", "v1", location=str(workspace))
        with pytest.raises(InvalidEvaluationError, match="answered HTTP 500"):
            runner.evaluate("j-e1")  # through the runner: an evaluation.failed, left pending
    assert len(server.requests) == 2

    with psycopg.connect(database_url) as conn:
        rows = conn.execute(_documented_query()).fetchall()  # type: ignore[call-overload]
    direct, through_runner = [row[1:] for row in rows]
    error = direct[5]
    assert error.startswith(f"{server.url}/chat/completions answered HTTP 500: ") and "fell over" in error
    assert direct == ("j-e1", "v1", server.url, "judge-model", None, error, direct[6], 1, None, None, None)
    assert through_runner[4:7] == (None, error, direct[6]) and through_runner[8:] == (
        "evaluation.failed",
        "j-e1:1",
        None,
    )


def test_a_judges_critique_of_an_asked_for_evaluation_goes_back_as_critique(
    pg_log: PostgresEventLog, server: JudgeServer, tmp_path: Path
) -> None:
    workspace = _closed_execution(pg_log, "j-e2", tmp_path / "ws")
    with OpenAIChatClient(server.url, "", "judge-model", timeout_s=30) as client:
        runner = EvaluationRunner(
            pg_log, _judge(client, pg_log, server.url), EvaluationConfig(retry_delay_s=0)
        )
        runner.preserve("j-e2", "mid", location=str(workspace))
        pg_log.append(
            [NewEvent(EvaluationRequested(execution_id="j-e2", run_id=RUN, artifact_version="mid"))]
        )
        recorded = runner.evaluate("j-e2", "mid")
    critique = "hello.txt greets the world, but without a name."
    assert isinstance(recorded, EvaluationRecorded) and recorded.critique == critique
    stored = [
        r.event
        for r in pg_log.read_stream(StreamId("evaluation", "j-e2"))
        if isinstance(r.event, EvaluationRecorded)
    ]
    assert [e.critique for e in stored] == [critique]
    # The proxy marks a tool result carrying this text as evaluator critique (never trained on).
    assert CritiqueBook(pg_log).refresh("j-e2") == frozenset({critique})


def test_gyre_runs_evaluator_judges_rubric_tasks_by_a_url_judge_and_the_rest_by_their_tests(
    pg_log: PostgresEventLog, server: JudgeServer, tmp_path: Path
) -> None:
    from gyre_tools.run_config import parse_config
    from gyre_tools.serve import sourced_evaluators
    from gyre_train.tasks import SandboxTestEvaluator, defined_tasks

    harbor = Path(__file__).resolve().parents[2] / "fixtures" / "harbor"
    config = parse_config(
        f'[tasks]\nsource = "{harbor}"\n[sandbox]\nkind = "bwrap"\n'
        f'[eval]\njudge = "{server.url}"\njudge_model = "judge-model"\njudge_key_env = "JUDGE_KEY"\n'
    )
    events = defined_tasks(str(harbor), RUN, train=3, heldout=0, seed=0, budget_s=60.0)
    defined = {e.task_id: e for e in events}
    evaluator_for, client = sourced_evaluators(config, pg_log, environ={"JUDGE_KEY": "sk-from-env"})
    assert client is not None
    try:
        assert isinstance(evaluator_for(defined["fix-add"]), SandboxTestEvaluator)  # no rubric
        judge = evaluator_for(defined["write-greeting"])
        assert isinstance(judge, JudgeEvaluator)
        workspace = _closed_execution(pg_log, "j-run", tmp_path / "ws")
        runner = EvaluationRunner(pg_log, judge, EvaluationConfig(retry_delay_s=0))
        runner.preserve("j-run", "v1", location=str(workspace))
        outcome = runner.settle("j-run", deadline=float("inf"))
    finally:
        client.close()
    assert (outcome.status, outcome.reward) == (RewardStatus.VALID, 0.6)
    [request] = server.requests
    assert server.headers[0]["Authorization"] == "Bearer sk-from-env"
    rubric = (harbor / "write-greeting" / "rubric.md").read_text()
    assert rubric.strip() in request["messages"][1]["content"]
