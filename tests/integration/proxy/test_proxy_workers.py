"""`gyre proxy serve --workers 2` as a process: one execution continued across calls that land
on different workers (each call on a new connection, so the kernel picks the worker).

Every call must extend the record of the call before it, whichever worker recorded that
one: a worker whose caches missed the other's record would match an older prefix and branch
the tree. Which worker answered is read from the ``x-gyre-proxy-worker`` header."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gyre_proxy import WORKER_HEADER, issue_key
from gyre_proxy.engines.refengine import ModelSource, ReferenceEngineConfig, ReferenceEngineServer, free_port
from gyre_store import PostgresEventLog, StoreConfig
from gyre_store.catalog import ModelCallRecorded, TitoArrays
from gyre_store.log import StreamId

ROOT = Path(__file__).resolve().parents[3]
TURNS = 12
TOOLS = [
    {
        "name": "Bash",
        "description": "run a command",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
    }
]


def tool_call(k: int) -> str:
    return (
        f'Step {k}.\n\n<tool_call>\n{{"name": "Bash", "arguments": {{"command": "echo {k}"}}}}\n</tool_call>'
    )


@pytest.fixture
def workers(database_url: str, tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"outputs": [tool_call(k) for k in range(TURNS)], "rule": "in_order"}))
    config = ReferenceEngineConfig(
        source=ModelSource(tokenizer="qwen", seed=0), max_context=8192, script=script
    )
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GYRE_")}
    env["GYRE_DATABASE_URL"] = database_url
    env["GYRE_PROXY_SPOOL_DIR"] = str(tmp_path / "spool")  # not under the user's ~/.gyre
    log = tmp_path / "proxy.log"
    with ReferenceEngineServer(config) as engine, log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "gyre_tools.cli", "proxy", "serve", "--engine", f"e0={engine.base_url}",
             "--port", str(port), "--workers", "2"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            seen: set[str] = set()
            deadline = time.monotonic() + 120
            while len(seen) < 2:  # both workers answer /health
                assert process.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                try:
                    with httpx.Client() as http:  # a new connection each time
                        seen.add(
                            http.get(f"http://127.0.0.1:{port}/health", timeout=1).headers[WORKER_HEADER]
                        )
                except httpx.TransportError:
                    time.sleep(0.2)
            yield f"http://127.0.0.1:{port}", process
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                raise
    assert process.returncode == 0, log.read_text()[-3000:]


def stored_calls(
    database_url: str, execution_id: str, count: int
) -> list[tuple[ModelCallRecorded, TitoArrays]]:
    deadline = time.monotonic() + 60
    while True:
        with PostgresEventLog(StoreConfig(database_url)) as log:
            calls = [
                (e.event, TitoArrays.from_payload(e.payload))
                for e in log.read_stream(StreamId("calls", execution_id))
                if isinstance(e.event, ModelCallRecorded)
            ]
        if len(calls) >= count:
            return calls
        assert time.monotonic() < deadline, f"{len(calls)} of {count} records reached the database"
        time.sleep(0.1)


def test_one_execution_continues_across_two_workers(
    workers: tuple[str, subprocess.Popen[bytes]], database_url: str
) -> None:
    base_url, _ = workers
    with PostgresEventLog(StoreConfig(database_url)) as log:
        key = issue_key(log, execution_id="ex-workers", run_id="workers-run", harness="claude-code")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Count with me."}]
    served_by: list[str] = []
    output_tokens = 0
    for k in range(TURNS):
        # A new client, so a new connection, per call: the kernel hands each to either worker.
        with anthropic.Anthropic(base_url=base_url, api_key=key, max_retries=0) as client:
            raw = client.messages.with_raw_response.create(
                model="gyre",
                max_tokens=200,
                tools=TOOLS,
                messages=messages,  # type: ignore[arg-type]
            )
            answer = raw.parse()
        served_by.append(raw.headers[WORKER_HEADER])
        output_tokens += answer.usage.output_tokens
        assert answer.stop_reason == "tool_use", answer
        use = next(b for b in answer.content if b.type == "tool_use")
        assert use.input == {"command": f"echo {k}"}
        messages += [
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in answer.content]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": f"{k}\n"}],
            },
        ]

    names = {s.split()[0] for s in served_by}
    assert names == {"worker-0", "worker-1"}, served_by
    assert len({s.split()[1] for s in served_by}) == 2  # two processes (pids)
    switches = sum(a.split()[0] != b.split()[0] for a, b in itertools.pairwise(served_by))
    assert switches >= 1

    # Whichever worker answers /metrics reports the sums over both (multiprocess mode).
    scraped_by: set[str] = set()
    deadline = time.monotonic() + 60
    while len(scraped_by) < 2:
        assert time.monotonic() < deadline, scraped_by
        with httpx.Client() as http:  # a new connection: either worker
            response = http.get(f"{base_url}/metrics", timeout=10)
        scraped_by.add(response.headers[WORKER_HEADER].split()[0])
        got = {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(response.text)
            for sample in family.samples
        }
        assert got[("gyre_proxy_requests_total", (("api", "anthropic_messages"),))] == TURNS
        assert got[("gyre_proxy_added_latency_seconds_count", ())] == TURNS
        assert got[("gyre_proxy_tokens_total", (("direction", "output"),))] == output_tokens
        assert got[("gyre_proxy_requests_in_flight", ())] == 0

    calls = stored_calls(database_url, "ex-workers", TURNS)
    assert len(calls) == TURNS  # one record per call: no retries, no duplicates
    lengths: dict[str, int] = {}
    for k, (call, arrays) in enumerate(calls):
        if k == 0:
            assert call.prefix_of is None
        else:
            # Each call extends the whole previous call (its input and its answer), even when
            # the previous one was recorded by the other worker.
            previous = calls[k - 1][0].request_id
            assert call.prefix_of == previous, (k, served_by)
            assert call.prefix_len == lengths[previous], (k, served_by)
        lengths[call.request_id] = call.prefix_len + arrays.input_len + arrays.output_len


def health_workers(base_url: str, want: int, timeout_s: float = 120) -> set[str]:
    """The ``worker pid`` values of ``want`` distinct answers to /health, each on a new connection."""
    seen: set[str] = set()
    deadline = time.monotonic() + timeout_s
    while len(seen) < want:
        assert time.monotonic() < deadline, seen
        try:
            with httpx.Client() as http:
                seen.add(http.get(f"{base_url}/health", timeout=1).headers[WORKER_HEADER])
        except httpx.TransportError:
            time.sleep(0.2)
    return seen


def test_a_killed_worker_is_started_again(
    workers: tuple[str, subprocess.Popen[bytes]], database_url: str
) -> None:
    base_url, _ = workers
    before = dict(s.split() for s in health_workers(base_url, 2))
    os.kill(int(before["worker-0"]), signal.SIGKILL)
    # The supervisor starts worker 0 again: a new pid answers under the same name.
    deadline = time.monotonic() + 120
    while True:
        now = dict(s.split() for s in health_workers(base_url, 1))
        if now.get("worker-0", before["worker-0"]) != before["worker-0"]:
            break
        assert time.monotonic() < deadline, "worker 0 was not started again"
        time.sleep(0.5)
    with PostgresEventLog(StoreConfig(database_url)) as log:
        key = issue_key(log, execution_id="ex-respawn", run_id="workers-run", harness="claude-code")
    for _ in range(4):  # on new connections, so the restarted worker gets some of them
        with anthropic.Anthropic(base_url=base_url, api_key=key, max_retries=0) as client:
            answer = client.messages.create(
                model="gyre",
                max_tokens=200,
                tools=TOOLS,
                messages=[{"role": "user", "content": "Go."}],  # type: ignore[arg-type]
            )
        assert answer.stop_reason == "tool_use"
