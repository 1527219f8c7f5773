"""`gyre engine serve`, `gyre proxy serve --engine e0=...` and `gyre executions new` started as
processes with the options the README shows (each on a free port instead of 30000 and 8080,
so runs do not collide), and one call through the anthropic SDK.

With their defaults the engine must take what the proxy sends: Qwen token ids (not the byte
vocabulary) and a harness-sized first request (over 2,048 tokens: a system prompt and tools
like a harness's)."""

from __future__ import annotations

import json
from pathlib import Path

import anthropic

from gyre_proxy.engines.refengine import free_port
from gyre_store import PostgresEventLog, StoreConfig
from gyre_store.catalog import ModelCallRecorded, TitoArrays
from gyre_store.log import StreamId
from tests.acceptance.conftest import gyre
from tests.acceptance.processes import gyre_process

SYSTEM = "You are a careful software engineer working in a repository. " * 400  # about 4,800 tokens


def test_engine_and_proxy_with_their_defaults_answer_an_sdk_call(
    fresh_database_url: str, tmp_path: Path
) -> None:
    env = {"GYRE_DATABASE_URL": fresh_database_url}
    engine_port, proxy_port = free_port(), free_port()
    engine_url = f"http://127.0.0.1:{engine_port}"

    with (
        gyre_process(["engine", "serve"], tmp_path / "engine.log", env, engine_port),
        gyre_process(
            ["proxy", "serve", "--engine", f"e0={engine_url}"], tmp_path / "proxy.log", env, proxy_port
        ) as (proxy_url, _),
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
    # The proxy was stopped with SIGTERM, which writes what its spool held first.
    with PostgresEventLog(StoreConfig(fresh_database_url)) as log:
        (recorded,) = log.read_stream(StreamId("calls", execution["execution_id"]))
    assert isinstance(recorded.event, ModelCallRecorded) and recorded.event.engine == "e0"
    arrays = TitoArrays.from_payload(recorded.payload)
    assert arrays.input_len == answer.usage.input_tokens
    assert arrays.output_len == answer.usage.output_tokens
    assert int(arrays.input_ids.max()) >= 256  # Qwen ids the byte vocabulary would have refused
