"""Parts of ``gyre demo`` that start servers: executions through the proxy, streaming training.

Each part starts what it needs (a reference engine, the proxy, training cells), runs a
few seconds of real work against the demo's store, prints what was recorded and stops.
"""

from __future__ import annotations

import json
import tempfile
import uuid
from pathlib import Path

import httpx
from rich.console import Console

from gyre_proxy.engines.refengine import ModelSource, ReferenceEngineConfig, ReferenceEngineServer
from gyre_proxy.service import ProxyConfig, ProxyService, issue_key
from gyre_store import PostgresEventLog, PostgresProjectionStore, catch_up
from gyre_store.trees import TreeProjection, TreeView

SCRIPT = {
    "rule": "cycle",
    "outputs": [
        'Let me look.\n\n<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"}}\n</tool_call>',
        "There are two files; I will summarize them.",
    ],
}


def proxy_part(log: PostgresEventLog, console: Console, *, executions: int = 3) -> list[str]:
    """Run a two-turn tool conversation per execution through the proxy; return their ids."""
    run_id = f"demo-proxy-{uuid.uuid4().hex[:6]}"
    ids = [f"{run_id}-e{i}" for i in range(executions)]
    with tempfile.TemporaryDirectory(prefix="gyre-demo-") as tmp:
        script = Path(tmp) / "script.json"
        script.write_text(json.dumps(SCRIPT))
        engine_cfg = ReferenceEngineConfig(
            source=ModelSource(tokenizer="qwen"), max_context=8192, script=script
        )
        with (
            ReferenceEngineServer(engine_cfg) as engine,
            ProxyService(
                log, ProxyConfig(engines=[("engine-0", engine.base_url)], context_limit=8192)
            ) as proxy,
            httpx.Client(base_url=proxy.base_url, timeout=120) as http,
        ):
            console.print(
                f"reference engine {engine.base_url} (tiny Qwen3 over the Qwen vocabulary), proxy {proxy.base_url}"
            )
            for ex in ids:
                key = issue_key(log, execution_id=ex, run_id=run_id, harness="claude-code")
                headers = {"x-api-key": key, "anthropic-version": "2023-06-01"}
                tools = [
                    {"name": "Bash", "description": "run a shell command", "input_schema": {"type": "object"}}
                ]
                messages: list[dict[str, object]] = [{"role": "user", "content": "What is in this folder?"}]
                body = {
                    "model": "gyre-policy",
                    "max_tokens": 200,
                    "system": "You are a coding agent.",
                    "tools": tools,
                }
                first = http.post("/v1/messages", json={**body, "messages": messages}, headers=headers).json()
                use = next(b for b in first["content"] if b["type"] == "tool_use")
                messages += [
                    {"role": "assistant", "content": first["content"]},
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": use["id"], "content": "a.py\nb.py"}
                        ],
                    },
                ]
                second = http.post(
                    "/v1/messages", json={**body, "messages": messages}, headers=headers
                ).json()
                console.print(
                    f"  {ex}: tool_use {use['name']}{use['input']} -> {second['content'][0]['text']!r}"
                )
            proxy.spool.flush(30)
    p = TreeProjection()
    store = PostgresProjectionStore(log.pool, {t.name: t for t in p.tables})
    catch_up(log, store, p)
    for ex in ids:
        s = TreeView.load(store, ex).stats()
        console.print(
            f"  recorded {ex}: {s.requests} calls, {s.unique_tokens:,} unique tokens stored for "
            f"{s.record_input_tokens:,} tokens of input, {s.trainable_tokens} trainable"
        )
    return ids


def streaming_part(redis_url: str, database_url: str, console: Console) -> None:
    """A core and a satellite train one batch together and publish to a reference engine."""
    from gyre_train.cells import demo_streaming

    with ReferenceEngineServer(ReferenceEngineConfig()) as engine:
        summary = demo_streaming(redis_url, engine.base_url, database_url=database_url)
        info = httpx.get(engine.base_url + "/model_info", timeout=30).json()
    console.print(
        f"  {summary.micro_steps} micro-steps claimed from Redis by the core and a satellite that joined "
        f"mid-batch; one optimizer update (parameter change {summary.parameter_change:.3g}) in "
        f"{summary.seconds:.1f}s; published as policy version {summary.policy_version}; the engine now "
        f"reports weight version {info.get('weight_version')!r}"
    )
