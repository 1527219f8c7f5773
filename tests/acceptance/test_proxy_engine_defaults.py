"""`gyre engine serve`, `gyre proxy serve --engine e0=...` and `gyre executions new` started as
processes with the options the README shows (each on a free port instead of 30000 and 8080,
so runs do not collide), and one call through the anthropic SDK.

With their defaults the engine must take what the proxy sends: Qwen token ids (not the byte
vocabulary) and a harness-sized first request (over 2,048 tokens: a system prompt and tools
like a harness's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anthropic
import httpx

from gyre_proxy.engines.refengine import free_port
from gyre_store import PostgresEventLog, StoreConfig
from gyre_store.catalog import ModelCallRecorded, TitoArrays
from gyre_store.log import StreamId
from tests.acceptance.conftest import ROOT, gyre

SYSTEM = "You are a careful software engineer working in a repository. " * 400  # about 4,800 tokens


@contextmanager
def process(args: list[str], env: dict[str, str], ready: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`gyre ARGS` as a user starts it, ready once ``ready`` answers; stopped on the way out."""
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gyre_tools.cli", *args],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, f"gyre {args[0]} exited: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"gyre {args[0]} never answered: {log.read_text()[-3000:]}"
            try:
                if httpx.get(ready, timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_engine_and_proxy_with_their_defaults_answer_an_sdk_call(
    fresh_database_url: str, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GYRE_")}
    env["GYRE_DATABASE_URL"] = fresh_database_url
    engine_port, proxy_port = free_port(), free_port()
    engine_url, proxy_url = f"http://127.0.0.1:{engine_port}", f"http://127.0.0.1:{proxy_port}"

    with (
        process(
            ["engine", "serve", "--port", str(engine_port)],
            env,
            f"{engine_url}/health",
            tmp_path / "engine.log",
        ),
        process(
            ["proxy", "serve", "--engine", f"e0={engine_url}", "--port", str(proxy_port)],
            env,
            f"{proxy_url}/health",
            tmp_path / "proxy.log",
        ),
    ):
        registered = gyre(
            "executions", "new", "--harness", "claude-code", "--json", "--proxy-url", proxy_url,
            env={"GYRE_DATABASE_URL": fresh_database_url},
        )  # fmt: skip
        assert registered.returncode == 0, registered.stderr
        execution = json.loads(registered.stdout)
        with anthropic.Anthropic(
            base_url=execution["base_url"], api_key=execution["api_key"], max_retries=0, timeout=300
        ) as client:
            answer = client.messages.create(
                model="gyre-policy",
                max_tokens=8,
                system=SYSTEM,
                messages=[{"role": "user", "content": "List the files."}],
            )

    assert answer.stop_reason in ("max_tokens", "end_turn", "tool_use"), answer
    assert answer.usage.input_tokens > 2048  # over the engine's old default context
    assert 0 < answer.usage.output_tokens <= 8
    with PostgresEventLog(StoreConfig(fresh_database_url)) as log:
        deadline = time.monotonic() + 60
        while not (stored := log.read_stream(StreamId("calls", execution["execution_id"]))):
            assert time.monotonic() < deadline, "the call was never recorded"
            time.sleep(0.2)
    (recorded,) = stored
    assert isinstance(recorded.event, ModelCallRecorded) and recorded.event.engine == "e0"
    arrays = TitoArrays.from_payload(recorded.payload)
    assert arrays.input_len == answer.usage.input_tokens
    assert arrays.output_len == answer.usage.output_tokens
    assert int(arrays.input_ids.max()) >= 256  # Qwen ids the byte vocabulary would have refused
