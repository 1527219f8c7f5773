"""A `gyre proxy serve` process killed with SIGKILL and started again on the same PostgreSQL
database continues an execution it never saw: the new process has nothing in memory, matches
the harness's history against the stored tree and extends the stored record (one path, one
root), and the records written before the kill are unchanged. One killed while the database
refuses writes loses no call it answered: the next process on its spool folder writes them.
One stopped with SIGTERM writes what its spool still holds before it exits."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anthropic
import numpy as np
import psycopg

from gyre_proxy.engines.refengine import ModelSource, ReferenceEngineConfig, ReferenceEngineServer, free_port
from gyre_proxy.ingest.spool_files import AnswerLog
from gyre_store import PostgresEventLog, StoreConfig
from gyre_store.catalog import ModelCallRecorded
from gyre_store.log import StreamId
from tests.acceptance.conftest import gyre
from tests.acceptance.processes import gyre_process, tree

TOOL_CALL = 'Let me look.\n\n<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"}}\n</tool_call>'
TOOLS = [
    {
        "name": "Bash",
        "description": "run a command",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
    }
]


@contextmanager
def proxy_process(
    database_url: str, engine_url: str, port: int, folder: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """`gyre proxy serve` as a user starts it, on ``port`` and the spool folder in ``folder`` in
    each of its lives; it logs to ``folder``/proxy.log and notes its answers in answers.jsonl."""
    args = ["proxy", "serve", "--engine", f"e0={engine_url}", "--spool-dir", str(folder / "spool"),
            "--answers-log", str(folder / "answers.jsonl")]  # fmt: skip
    with gyre_process(args, folder / "proxy.log", {"GYRE_DATABASE_URL": database_url}, port) as (_, process):
        yield process


def refuse_writes(database_url: str, refuse: bool) -> None:
    """The database refuses writes (or takes them again), as a standby does just after a
    failover: new sessions are read-only, and the ones open now are ended."""
    name = database_url.rsplit("/", 1)[-1]
    setting = "SET default_transaction_read_only = on" if refuse else "RESET default_transaction_read_only"
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute("SET default_transaction_read_only = off")  # this session writes
        admin.execute(f'ALTER DATABASE "{name}" {setting}')
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        )


def stored_calls(database_url: str, execution_id: str) -> list[ModelCallRecorded]:
    with PostgresEventLog(StoreConfig(database_url)) as log:
        return [
            e.event
            for e in log.read_stream(StreamId("calls", execution_id))
            if isinstance(e.event, ModelCallRecorded)
        ]


def wait_for_calls(database_url: str, execution_id: str, count: int) -> list[ModelCallRecorded]:
    """The execution's records once `count` are in PostgreSQL (the proxy writes them off the path)."""
    deadline = time.monotonic() + 60
    while len(calls := stored_calls(database_url, execution_id)) < count:
        assert time.monotonic() < deadline, f"{len(calls)} of {count} records reached the database"
        time.sleep(0.1)
    return calls


def scripted_execution(
    database_url: str, tmp_path: Path, outputs: list[str], execution_id: str
) -> tuple[ReferenceEngineConfig, int, dict[str, str]]:
    """A reference engine answering ``outputs`` in order, the proxy's port, and an execution
    registered for it (its key and base URL) as `gyre executions new` prints it."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"outputs": outputs, "rule": "in_order"}))
    engine_config = ReferenceEngineConfig(
        source=ModelSource(tokenizer="qwen", seed=0), max_context=8192, script=script
    )
    port = free_port()
    registered = gyre(
        "executions", "new", "--json", "--run-id", f"{execution_id}-run", "--execution-id", execution_id,
        "--proxy-url", f"http://127.0.0.1:{port}", env={"GYRE_DATABASE_URL": database_url},
    )  # fmt: skip
    assert registered.returncode == 0, registered.stderr
    return engine_config, port, json.loads(registered.stdout)


def test_a_killed_proxy_process_restarted_on_the_database_continues_an_execution(
    fresh_database_url: str, tmp_path: Path
) -> None:
    engine_config, port, execution = scripted_execution(
        fresh_database_url, tmp_path, [TOOL_CALL, "There are two files."], "ex-restart"
    )
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is in this folder?"}]

    with ReferenceEngineServer(engine_config) as engine:
        with proxy_process(fresh_database_url, engine.base_url, port, tmp_path) as first:
            client = anthropic.Anthropic(
                base_url=execution["base_url"], api_key=execution["api_key"], max_retries=0
            )
            answer = client.messages.create(model="gyre", max_tokens=300, tools=TOOLS, messages=messages)  # type: ignore[arg-type]
            client.close()
            assert answer.stop_reason == "tool_use"
            (before,) = wait_for_calls(fresh_database_url, "ex-restart", 1)
            view = tree(fresh_database_url, "ex-restart")
            first_input, first_output = (
                view.input_of(before.request_id)[0],
                view.output_of(before.request_id)[0],
            )
            first.send_signal(signal.SIGKILL)
            assert first.wait(30) == -signal.SIGKILL

        use = next(b for b in answer.content if b.type == "tool_use")
        messages += [
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in answer.content]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "a.py\nb.py"}],
            },
        ]
        with proxy_process(fresh_database_url, engine.base_url, port, tmp_path):
            client = anthropic.Anthropic(
                base_url=execution["base_url"], api_key=execution["api_key"], max_retries=0
            )
            second = client.messages.create(model="gyre", max_tokens=300, tools=TOOLS, messages=messages)  # type: ignore[arg-type]
            client.close()
            assert [b.text for b in second.content if b.type == "text"] == ["There are two files."]
            calls = wait_for_calls(fresh_database_url, "ex-restart", 2)

    # The record from before the kill is untouched, and the continuation extends it.
    assert calls[0] == before
    assert calls[1].prefix_of == before.request_id
    assert calls[1].prefix_len == len(first_input) + len(first_output)
    view = tree(fresh_database_url, "ex-restart")
    np.testing.assert_array_equal(view.input_of(before.request_id)[0], first_input)
    np.testing.assert_array_equal(view.output_of(before.request_id)[0], first_output)
    second_input = view.input_of(calls[1].request_id)[0]
    np.testing.assert_array_equal(second_input[: len(first_input) + len(first_output)],
                                  np.concatenate([first_input, first_output]))  # fmt: skip
    assert len(second_input) > len(first_input) + len(first_output)  # the tool result was added
    stats = view.stats()
    assert stats.requests == 2 and stats.roots == 1  # one path: no new root after the restart
    first_end = view.records[before.request_id].end_node
    assert first_end in view.path(view.records[calls[1].request_id].end_node)


def test_a_proxy_killed_while_the_database_refuses_writes_loses_no_answered_call(
    fresh_database_url: str, tmp_path: Path
) -> None:
    """Three calls are answered while the database refuses writes; the proxy is killed with
    SIGKILL before it could write them. Started again on the same spool folder once the
    database takes writes again, the proxy writes them before it serves, and the execution
    goes on from the last of them. The store holds exactly the calls the proxy answered."""
    outputs = ["One.", "Two.", "Three.", "Four."]
    engine_config, port, execution = scripted_execution(fresh_database_url, tmp_path, outputs, "ex-outage")
    messages: list[dict[str, Any]] = []

    def turn(n: int) -> None:
        messages.append({"role": "user", "content": f"Step {n}?"})
        with anthropic.Anthropic(
            base_url=execution["base_url"], api_key=execution["api_key"], max_retries=0
        ) as client:
            answer = client.messages.create(model="gyre", max_tokens=50, messages=messages)  # type: ignore[arg-type]
        [text] = [b.text for b in answer.content if b.type == "text"]
        assert text == outputs[n - 1]
        messages.append({"role": "assistant", "content": text})

    with ReferenceEngineServer(engine_config) as engine:
        try:
            with proxy_process(fresh_database_url, engine.base_url, port, tmp_path) as first:
                turn(1)
                wait_for_calls(fresh_database_url, "ex-outage", 1)
                refuse_writes(fresh_database_url, True)
                turn(2)
                turn(3)
                assert len(stored_calls(fresh_database_url, "ex-outage")) == 1  # two wait in the spool
                first.send_signal(signal.SIGKILL)
                assert first.wait(30) == -signal.SIGKILL
        finally:
            refuse_writes(fresh_database_url, False)
        with proxy_process(fresh_database_url, engine.base_url, port, tmp_path):
            # It serves once what the killed process left is written.
            assert len(stored_calls(fresh_database_url, "ex-outage")) == 3
            turn(4)
            calls = wait_for_calls(fresh_database_url, "ex-outage", 4)

    # Each call extends the one before it: one path, and the tree has one root.
    assert [c.prefix_of for c in calls[1:]] == [c.request_id for c in calls[:-1]]
    stats = tree(fresh_database_url, "ex-outage").stats()
    assert stats.requests == 4 and stats.roots == 1
    # What the proxy answered and what the store holds, one to one.
    answered = [(a["execution_id"], a["request_id"]) for a in AnswerLog.read(tmp_path / "answers.jsonl")]
    assert sorted(answered) == sorted((c.execution_id, c.request_id) for c in calls)
    assert len(set(answered)) == len(answered) == 4


def test_sigterm_writes_the_spooled_records_before_the_proxy_exits(
    fresh_database_url: str, tmp_path: Path
) -> None:
    """A process manager stops `gyre proxy serve` with SIGTERM. Records the spool still holds
    (here: held back by a lock on the event table) are written before the process exits."""
    engine_config, port, execution = scripted_execution(
        fresh_database_url, tmp_path, ["There are two files."], "ex-term"
    )

    with (
        ReferenceEngineServer(engine_config) as engine,
        proxy_process(fresh_database_url, engine.base_url, port, tmp_path) as proxy,
    ):
        with psycopg.connect(fresh_database_url) as blocker:
            # Readers pass; the spool's append waits until this transaction ends.
            blocker.execute("LOCK TABLE gyre_events IN EXCLUSIVE MODE")
            with anthropic.Anthropic(
                base_url=execution["base_url"], api_key=execution["api_key"], max_retries=0
            ) as client:
                answer = client.messages.create(
                    model="gyre", max_tokens=50, messages=[{"role": "user", "content": "What is here?"}]
                )
            assert [b.text for b in answer.content if b.type == "text"] == ["There are two files."]
            assert stored_calls(fresh_database_url, "ex-term") == []  # still in the spool
            proxy.send_signal(signal.SIGTERM)
            time.sleep(1.0)
            assert proxy.poll() is None, "the proxy exited with a record unwritten"
        # The lock is released: the spool writes, and the process ends cleanly.
        assert proxy.wait(30) == 0, (tmp_path / "proxy.log").read_text()[-2000:]

    (call,) = stored_calls(fresh_database_url, "ex-term")
    assert call.execution_id == "ex-term"
