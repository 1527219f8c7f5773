"""The proxy's /metrics over real HTTP: real calls through the proxy to a reference engine,
then the text scraped and parsed, and each figure held against what the calls reported."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import pytest
from scraping import scrape, value

from gyre_proxy.engines.refengine import ModelSource, ReferenceEngineConfig, ReferenceEngineServer
from gyre_proxy.service import ProxyConfig, ProxyService, issue_key
from gyre_store import InMemoryEventLog


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[ProxyService]:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"outputs": ["Hello there.", "A second answer."], "rule": "in_order"}))
    engine_config = ReferenceEngineConfig(
        source=ModelSource(tokenizer="qwen", seed=0), max_context=4096, script=script
    )
    with (
        ReferenceEngineServer(engine_config) as engine,
        ProxyService(
            InMemoryEventLog(), ProxyConfig(engines=[("e0", engine.base_url)], context_limit=4096)
        ) as service,
    ):
        yield service


def test_requests_tokens_and_added_latency_are_counted(proxy: ProxyService) -> None:
    before = scrape(proxy.base_url)
    assert value(before, "gyre_proxy_requests_total", api="anthropic_messages") == 0
    key = issue_key(proxy.log, execution_id="ex1", run_id="run1", harness="claude-code")
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=key, max_retries=0)
    messages = [{"role": "user", "content": "Say hello."}]
    first = client.messages.create(model="gyre", max_tokens=50, messages=messages)  # type: ignore[arg-type]
    with client.messages.stream(model="gyre", max_tokens=50, messages=messages) as stream:  # type: ignore[arg-type]
        second = stream.get_final_message()

    after = scrape(proxy.base_url)
    assert value(after, "gyre_proxy_requests_total", api="anthropic_messages") == 2
    assert value(after, "gyre_proxy_tokens_total", direction="input") == (
        first.usage.input_tokens + second.usage.input_tokens
    )
    assert value(after, "gyre_proxy_tokens_total", direction="output") == (
        first.usage.output_tokens + second.usage.output_tokens
    )
    assert first.usage.output_tokens > 0
    assert value(after, "gyre_proxy_added_latency_seconds_count") == 2
    assert value(after, "gyre_proxy_added_latency_seconds_bucket", le="+Inf") == 2
    assert value(after, "gyre_proxy_added_latency_seconds_sum") > 0
    assert value(after, "gyre_proxy_requests_in_flight") == 0
    assert not [k for k in after if k[0] == "gyre_proxy_errors_total"]


def test_errors_are_counted_by_kind(proxy: ProxyService) -> None:
    bad_key = httpx.post(
        f"{proxy.base_url}/v1/messages",
        headers={"x-api-key": "not-a-key", "anthropic-version": "2023-06-01"},
        json={"model": "gyre", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert bad_key.status_code == 401
    key = issue_key(proxy.log, execution_id="ex2", run_id="run1", harness="claude-code")
    not_json = httpx.post(
        f"{proxy.base_url}/v1/chat/completions",
        headers={"authorization": f"Bearer {key}"},
        content=b"{not json",
    )
    assert not_json.status_code == 400

    samples = scrape(proxy.base_url)
    assert value(samples, "gyre_proxy_errors_total", api="anthropic_messages", kind="authentication") == 1
    assert value(samples, "gyre_proxy_errors_total", api="openai_chat", kind="invalid_request") == 1
    assert value(samples, "gyre_proxy_requests_total", api="anthropic_messages") == 1
    assert value(samples, "gyre_proxy_requests_total", api="openai_chat") == 1
    assert value(samples, "gyre_proxy_requests_in_flight") == 0
    # No model call finished: nothing generated, nothing timed.
    assert value(samples, "gyre_proxy_added_latency_seconds_count") == 0
    assert value(samples, "gyre_proxy_tokens_total", direction="output") == 0
