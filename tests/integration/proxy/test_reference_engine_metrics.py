"""The reference engine's /metrics over real HTTP: tokens generated equal what its answers
reported, and the gauges show a request held mid-answer (paused in place) and drop back."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gyre_proxy.engines.refengine import ReferenceEngineConfig, ReferenceEngineServer

PROMPT = [5, 6, 7, 8, 9, 10, 11]


def scrape(base_url: str) -> dict[str, float]:
    response = httpx.get(f"{base_url}/metrics")
    assert response.status_code == 200
    return {s.name: s.value for f in text_string_to_metric_families(response.text) for s in f.samples}


@pytest.fixture
def server() -> Iterator[ReferenceEngineServer]:
    with ReferenceEngineServer(ReferenceEngineConfig(max_context=512, seed=0)) as running:
        yield running


def test_generated_tokens_count_what_the_answers_reported(server: ReferenceEngineServer) -> None:
    assert scrape(server.base_url)["gyre_engine_generated_tokens_total"] == 0
    produced = 0
    for n in (3, 11):
        body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": n, "ignore_eos": True}}
        answer = httpx.post(f"{server.base_url}/generate", json=body, timeout=60).json()
        produced += answer["meta_info"]["completion_tokens"]
    assert produced == 14
    after = scrape(server.base_url)
    assert after["gyre_engine_generated_tokens_total"] == produced
    assert after["gyre_engine_requests_running"] == 0
    assert after["gyre_engine_requests_waiting"] == 0
    assert after["gyre_engine_kv_tokens"] == 0
    assert after["gyre_engine_accepting"] == 1
    assert after["gyre_engine_kv_pinned_bytes"] == 0
    assert after["gyre_engine_kv_pinned_max_bytes"] > 0


def test_a_request_held_mid_answer_shows_in_the_gauges(server: ReferenceEngineServer) -> None:
    url = server.base_url
    body = {
        "input_ids": PROMPT,
        "sampling_params": {"max_new_tokens": 400, "ignore_eos": True},
        "stream": True,
        "rid": "held",
    }
    with (
        httpx.Client(base_url=url, timeout=60) as http,
        http.stream("POST", "/generate", json=body) as stream,
    ):
        lines = stream.iter_lines()
        first = next(line for line in lines if line.startswith("data:"))
        assert json.loads(first[5:])["meta_info"]["completion_tokens"] >= 1
        # Paused in place, the request keeps its cache and stops between two passes.
        assert http.post("/pause_generation", json={"mode": "in_place"}).status_code == 200
        held = scrape(url)
        assert held["gyre_engine_requests_running"] == 1
        assert held["gyre_engine_requests_waiting"] == 0
        # Its cache holds its prompt and every token it produced, all counted as generated.
        assert held["gyre_engine_kv_tokens"] == len(PROMPT) + held["gyre_engine_generated_tokens_total"]
        assert http.post("/abort_request", json={"rid": "held"}).status_code == 200
        assert http.post("/continue_generation", json={}).status_code == 200
    deadline = time.monotonic() + 30
    while (now := scrape(url))["gyre_engine_requests_running"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert now["gyre_engine_requests_running"] == 0
    assert now["gyre_engine_kv_tokens"] == 0
