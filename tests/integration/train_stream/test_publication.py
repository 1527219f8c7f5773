"""Publication to a real reference-engine server: after a core and a satellite train one batch,
the engine reports the new weight version on its answers and its logprobs change."""

from __future__ import annotations

from typing import Any

import httpx

from gyre_proxy.engines.refengine import ModelSource, ReferenceEngineConfig, ReferenceEngineServer
from gyre_store import PostgresEventLog, WeightsPublished, iterate
from gyre_train.cells import demo_streaming

PROMPT = {"input_ids": [257, 72, 105, 258, 257], "return_logprob": True,
          "sampling_params": {"max_new_tokens": 4, "temperature": 0.0}}  # fmt: skip


def _generate(base_url: str) -> tuple[str, list[float]]:
    answer: dict[str, Any] = httpx.post(f"{base_url}/generate", json=PROMPT, timeout=30).json()
    meta = answer["meta_info"]
    return str(meta["weight_version"]), [float(entry[0]) for entry in meta["output_token_logprobs"]]


def test_demo_publishes_the_update_to_the_reference_engine(
    redis_url: str, database_url: str, pg_log: PostgresEventLog
) -> None:
    with ReferenceEngineServer(ReferenceEngineConfig(source=ModelSource(seed=0))) as engine:
        version_before, logprobs_before = _generate(engine.base_url)
        summary = demo_streaming(redis_url, engine.base_url, database_url=database_url)
        version_after, logprobs_after = _generate(engine.base_url)
    assert version_before == "default" and version_after == "1"
    assert summary.policy_version == 1 and summary.parameter_change > 0
    assert max(abs(a - b) for a, b in zip(logprobs_before, logprobs_after, strict=True)) > 1e-4
    published = [e.event for e in iterate(pg_log) if isinstance(e.event, WeightsPublished)]
    assert [(p.policy_version, p.step) for p in published] == [(1, 0)]
