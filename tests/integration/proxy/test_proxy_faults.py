"""Faults around the answer pipeline: the database away, contexts over the limit, no engine."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import pytest

from gyre_proxy.engines.refengine import ModelSource, ReferenceEngineConfig, ReferenceEngineServer
from gyre_proxy.service import ProxyConfig, ProxyService, issue_key
from gyre_store import PostgresEventLog, RetryPolicy, StoreConfig
from gyre_store.db import migrate
from gyre_store.log import StreamId
from tests import pgcluster
from tests.real_servers import require


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[ReferenceEngineServer]:
    (tmp_path / "s.json").write_text(json.dumps({"outputs": ["Fine."], "rule": "cycle"}))
    cfg = ReferenceEngineConfig(
        source=ModelSource(tokenizer="qwen"), max_context=4096, script=tmp_path / "s.json"
    )
    with ReferenceEngineServer(cfg) as server:
        yield server


def test_records_wait_in_the_spool_while_the_database_is_down(engine: ReferenceEngineServer) -> None:
    require("postgres_binaries", pgcluster.missing())
    cluster = pgcluster.PrivateCluster().init()
    try:
        migrate.upgrade(cluster.url)
        config = StoreConfig(cluster.url, retry=RetryPolicy(give_up_after_s=1.0))
        with (
            PostgresEventLog(config) as log,
            ProxyService(log, ProxyConfig(engines=[("e", engine.base_url)])) as proxy,
        ):
            key = issue_key(log, execution_id="ex", run_id="r", harness="claude-code")
            client = anthropic.Anthropic(base_url=proxy.base_url, api_key=key, max_retries=0)
            client.messages.create(model="m", max_tokens=50, messages=[{"role": "user", "content": "one"}])
            assert proxy.spool.flush(10)
            cluster.stop("fast")
            began = time.monotonic()
            answer = client.messages.create(
                model="m",
                max_tokens=50,
                messages=[
                    {"role": "user", "content": "one"},
                    {"role": "assistant", "content": "Fine."},
                    {"role": "user", "content": "two"},
                ],
            )
            assert answer.content[0].text == "Fine."  # type: ignore[union-attr]
            assert time.monotonic() - began < 10  # the harness was not held up by the outage
            assert proxy.spool.pending == 1
            time.sleep(1.5)  # the spool keeps retrying against the dead database
            assert proxy.spool.pending == 1
            cluster.start()
            assert proxy.spool.flush(60)
            records = log.read_stream(StreamId("calls", "ex"))
            assert len(records) == 2
            assert records[1].event.prefix_of == records[0].event.request_id  # type: ignore[attr-defined]
    finally:
        cluster.destroy()


def test_a_context_over_the_limit_is_the_apis_own_error(engine: ReferenceEngineServer) -> None:
    from gyre_store import InMemoryEventLog

    log = InMemoryEventLog()
    with ProxyService(log, ProxyConfig(engines=[("e", engine.base_url)], context_limit=300)) as proxy:
        key = issue_key(log, execution_id="ex", run_id="r", harness="claude-code")
        client = anthropic.Anthropic(base_url=proxy.base_url, api_key=key, max_retries=0)
        with pytest.raises(anthropic.BadRequestError, match="prompt is too long"):
            client.messages.create(
                model="m", max_tokens=10, messages=[{"role": "user", "content": "word " * 2000}]
            )
        assert log.read_stream(StreamId("calls", "ex")) == []  # nothing recorded for a refused call


def test_a_stop_sequence_spanning_deltas_never_reaches_the_harness(tmp_path: Path) -> None:
    from gyre_store import InMemoryEventLog

    (tmp_path / "stop.json").write_text(
        json.dumps({"outputs": ["I will continue the work now."], "rule": "cycle"})
    )
    cfg = ReferenceEngineConfig(
        source=ModelSource(tokenizer="qwen"), max_context=4096, script=tmp_path / "stop.json"
    )
    log = InMemoryEventLog()
    with (
        ReferenceEngineServer(cfg) as engine,
        ProxyService(log, ProxyConfig(engines=[("e", engine.base_url)])) as proxy,
    ):
        key = issue_key(log, execution_id="ex", run_id="r", harness="claude-code")
        client = anthropic.Anthropic(base_url=proxy.base_url, api_key=key, max_retries=0)
        pieces: list[str] = []
        request = {"role": "user", "content": "go"}
        with client.messages.stream(
            model="m", max_tokens=50, messages=[request], stop_sequences=["continue the"]
        ) as stream:
            pieces.extend(stream.text_stream)
            final = stream.get_final_message()
        streamed = "".join(pieces)
        assert "contin" not in streamed and streamed.strip() == "I will"
        assert final.stop_reason == "stop_sequence" and final.stop_sequence == "continue the"
        plain = client.messages.create(model="m", max_tokens=50, messages=[request])
        assert plain.content[0].text == "I will continue the work now."  # type: ignore[union-attr]


def test_the_proxys_max_tokens_caps_what_a_harness_asks_for(tmp_path: Path) -> None:
    from gyre_store import InMemoryEventLog

    (tmp_path / "long.json").write_text(
        json.dumps(
            {"outputs": ["one two three four five six seven eight nine ten eleven twelve"], "rule": "cycle"}
        )
    )
    cfg = ReferenceEngineConfig(
        source=ModelSource(tokenizer="qwen"), max_context=4096, script=tmp_path / "long.json"
    )
    log = InMemoryEventLog()
    with (
        ReferenceEngineServer(cfg) as engine,
        ProxyService(log, ProxyConfig(engines=[("e", engine.base_url)], max_tokens=4)) as proxy,
    ):
        key = issue_key(log, execution_id="ex", run_id="r", harness="claude-code")
        client = anthropic.Anthropic(base_url=proxy.base_url, api_key=key, max_retries=0)
        # As Claude Code does: a streamed call asking for 32,000 tokens.
        with client.messages.stream(
            model="m", max_tokens=32_000, messages=[{"role": "user", "content": "go"}]
        ) as stream:
            capped = stream.get_final_message()
        assert capped.stop_reason == "max_tokens" and capped.usage.output_tokens == 4
        # Asking for less than the cap gets what was asked.
        fewer = client.messages.create(
            model="m", max_tokens=2, messages=[{"role": "user", "content": "again"}]
        )
        assert fewer.stop_reason == "max_tokens" and fewer.usage.output_tokens == 2
        assert proxy.spool.flush(10)
        records = log.read_stream(StreamId("calls", "ex"))
        assert [len(r.payload["output_ids"]) for r in records if r.payload is not None] == [4, 2]  # type: ignore[index]
