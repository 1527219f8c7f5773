"""``metered`` and ``ProxyMetrics`` without a proxy: an error event inside a stream counts as an
error of its kind, /metrics is answered in Prometheus's text format, and in multiprocess mode
the figures of every worker's files are summed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gyre_proxy.api import STREAM_ERROR_KEY
from gyre_proxy.exceptions import Overloaded
from gyre_proxy.service import ProxyMetrics, metered


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def streaming_app(scope: Any, receive: Any, send: Any) -> None:
    """A 200 whose stream ends with an error event, as ``api/sse.py`` writes one."""
    await send({"type": "http.response.start", "status": 200, "headers": []})
    scope[STREAM_ERROR_KEY] = Overloaded()
    await send({"type": "http.response.body", "body": b"event: error\ndata: {}\n\n"})


@pytest.mark.anyio
async def test_an_error_event_in_a_stream_counts_by_its_kind() -> None:
    metrics = ProxyMetrics()
    app = metered(streaming_app, metrics)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy") as client:
        assert (await client.post("/v1/messages")).status_code == 200
        assert (await client.get("/health")).status_code == 200  # not a harness request: not counted
        scraped = await client.get("/metrics")
    got = samples(scraped.text)
    assert got[("gyre_proxy_requests_total", (("api", "anthropic_messages"),))] == 1
    assert got[("gyre_proxy_errors_total", (("api", "anthropic_messages"), ("kind", "overloaded")))] == 1
    assert got[("gyre_proxy_requests_in_flight", ())] == 0
    assert got[("gyre_proxy_requests_total", (("api", "openai_chat"),))] == 0


WORKER = """
import sys
from pathlib import Path
from gyre_proxy.service import ProxyMetrics
m = ProxyMetrics(multiprocess_dir=Path(sys.argv[1]))
m.request_started("openai_chat")
m.answered(int(sys.argv[2]), 7, 0.01)
m.request_ended("openai_chat", None)
m.request_started("openai_chat")  # still in flight when the process exits
"""


def test_multiprocess_mode_sums_the_workers(tmp_path: Path) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    for tokens in (100, 23):
        subprocess.run([sys.executable, "-c", WORKER, str(tmp_path), str(tokens)], env=env, check=True)
    # Read as a worker reads it (this process is not in multiprocess mode: it only sums the files).
    got = samples(ProxyMetrics(multiprocess_dir=tmp_path).exposition().decode())
    assert got[("gyre_proxy_requests_total", (("api", "openai_chat"),))] == 4
    assert got[("gyre_proxy_tokens_total", (("direction", "input"),))] == 123
    assert got[("gyre_proxy_tokens_total", (("direction", "output"),))] == 14
    assert got[("gyre_proxy_added_latency_seconds_count", ())] == 2
    # livesum: both processes' gauges (1 each) until they are marked dead.
    assert got[("gyre_proxy_requests_in_flight", ())] == 2
