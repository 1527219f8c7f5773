"""Synthetic Claude Code executions through incremental encoding into trajectory trees."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gyre_proxy.chat import ChatRequest, Message, Role, TextBlock, ToolResultBlock, ToolUseBlock
from gyre_proxy.harness import ClaudeCodeHarness, GenericHarness
from gyre_proxy.ingest import (
    Ingestor,
    Qwen3Template,
    TraceConfig,
    TraceGenerator,
    encode_request,
    full_messages,
)
from gyre_store import InMemoryEventLog, InMemoryProjectionStore, catch_up
from gyre_store.catalog import CallFinish, Provenance, TitoArrays
from gyre_store.trees import ExecutionContext, TrajectoryRecorder, TreeProjection, TreeView

SMALL = TraceConfig(
    seed=3,
    main_requests=70,
    compact_at=12_000,
    subagents=2,
    subagent_requests=(8, 12),
    subagent_compact_at=2_500,
    retry_every=23,
    tool_result_words=(30, 300),
    interrupt_at=9,
)


@pytest.fixture(scope="module")
def traced(template: Qwen3Template) -> tuple[InMemoryEventLog, TreeView, TraceGenerator]:
    log = InMemoryEventLog()
    gen = TraceGenerator(Ingestor(TrajectoryRecorder(log), template, ClaudeCodeHarness()), SMALL)
    gen.run("ex", "run")
    p = TreeProjection()
    store = InMemoryProjectionStore({t.name: t for t in p.tables}, log)
    catch_up(log, store, p)
    return log, TreeView.load(store, "ex"), gen


def test_every_record_of_a_generated_execution_rebuilds_bit_exactly(
    traced: tuple[InMemoryEventLog, TreeView, TraceGenerator],
) -> None:
    log, view, _ = traced
    full: dict[str, np.ndarray] = {}
    for ev in log.read(0, limit=100_000):
        e, a = ev.event, TitoArrays.from_payload(ev.payload)
        prefix = full[e.prefix_of][: e.prefix_len] if e.prefix_of else np.zeros(0, np.int32)  # type: ignore[attr-defined]
        expected = np.concatenate([prefix, a.input_ids])
        full[e.request_id] = np.concatenate([expected, a.output_ids])  # type: ignore[attr-defined]
        got, _ = view.input_of(e.request_id)  # type: ignore[attr-defined]
        np.testing.assert_array_equal(got, expected)
        out, lp = view.output_of(e.request_id)  # type: ignore[attr-defined]
        np.testing.assert_array_equal(out, a.output_ids)
        np.testing.assert_array_equal(lp, a.output_logprobs)


def test_branching_under_compaction_subagents_and_retries(
    traced: tuple[InMemoryEventLog, TreeView, TraceGenerator],
) -> None:
    _, view, gen = traced
    stats = view.stats()
    assert stats.requests == gen.requests
    assert stats.roots == 2  # the main agent's system prompt and the sub-agents' one
    by_class = stats.candidates_by_class
    assert by_class["main"] == 1 and by_class["main_summary"] >= 2 and by_class["sub_agent"] == 2
    assert by_class.get("sub_agent_summary", 0) >= 1
    assert sum(1 for r in view.records.values() if r.superseded) == sum(
        1 for r in view.records.values() if r.finish == "abort"
    )
    # only new messages were tokenized, and the tree stores each unique token once
    assert gen.tokenized == gen.new_tokens
    assert stats.unique_tokens <= 1.02 * (gen.new_tokens + sum(r.output_len for r in view.records.values()))
    assert stats.record_input_tokens > 5 * stats.unique_tokens


def test_tool_results_are_harness_provenance_and_only_outputs_are_trainable(
    traced: tuple[InMemoryEventLog, TreeView, TraceGenerator],
) -> None:
    _, view, _ = traced
    provs = np.concatenate([n.provenance for n in view.nodes.values()])
    assert {
        Provenance.SYSTEM,
        Provenance.USER,
        Provenance.TOOL_RESULT,
        Provenance.TEMPLATE,
        Provenance.SAMPLED,
    } <= set(provs.tolist())
    for n in view.nodes.values():
        if n.kind == "input":
            assert n.trainable is None and not np.any(n.provenance == Provenance.SAMPLED)
        else:
            assert n.trainable is not None and np.all(n.provenance == Provenance.SAMPLED)


def test_reserialized_history_still_matches_its_prefix(template: Qwen3Template) -> None:
    log = InMemoryEventLog()
    ing = Ingestor(TrajectoryRecorder(log), template, GenericHarness())
    user = Message(Role.USER, (TextBlock("list the files"),))
    first = ChatRequest(system="sys", messages=(user,))
    p1 = ing.prepare("ex", "run", first)
    assert p1.encoded.prefix is None
    use = ToolUseBlock("toolu_1", "Bash", '{"command":"ls","timeout":5}')
    answer = Message(Role.ASSISTANT, (TextBlock("Let me look."), use))
    out = template.render_output(answer)
    ing.record(
        p1,
        request_id="r1",
        output_ids=np.array(out.ids, np.int32),
        output_logprobs=np.full(len(out), -0.5, np.float32),
        assistant=answer,
        finish=CallFinish.STOP,
    )
    # The harness sends the history back with the tool input re-serialized and the system
    # prompt unchanged; the prefix (including the sampled answer) must be reused as stored.
    resent = Message(
        Role.ASSISTANT,
        (
            TextBlock("Let me look."),
            ToolUseBlock("toolu_1", "Bash", json.dumps({"timeout": 5, "command": "ls"}, indent=2)),
        ),
    )
    second = ChatRequest(
        system="sys", messages=(user, resent, Message(Role.USER, (ToolResultBlock("toolu_1", "a.py\nb.py"),)))
    )
    p2 = ing.prepare("ex", "run", second)
    assert p2.encoded.prefix is not None and p2.encoded.prefix.request_id == "r1"
    assert p2.encoded.prefix.after_output and p2.encoded.prefix_len == p1.encoded.input_len + len(out)
    assert template.tok.decode(p2.encoded.new_ids.tolist()).startswith(
        "\n<|im_start|>user\n<tool_response>\na.py"
    )
    # an identical resend (a retry) matches the whole input: nothing new to tokenize
    p3 = ing.prepare("ex", "run", first)
    assert p3.encoded.tokenized == 0 and p3.encoded.prefix is not None


def test_tokenizing_only_new_messages_equals_rendering_everything(template: Qwen3Template) -> None:
    msgs = (
        Message(Role.USER, (TextBlock("hello"),)),
        Message(Role.ASSISTANT, (TextBlock("hi"),)),
        Message(Role.USER, (TextBlock("bye"),)),
    )
    request = ChatRequest(system="be brief", messages=msgs, thinking=True)
    encoded = encode_request(ExecutionContext("fresh"), template, request)
    whole = template.render_system("be brief", ())
    for m in full_messages(request)[1:]:
        part = template.render_message(m)
        whole.ids.extend(part.ids)
    whole.ids.extend(template.generation_prompt(thinking=True).ids)
    assert encoded.new_ids.tolist() == whole.ids
    assert encoded.msg_ends.shape[0] == 4


def test_a_truncated_answer_is_not_reused_as_history(template: Qwen3Template) -> None:
    log = InMemoryEventLog()
    ing = Ingestor(TrajectoryRecorder(log), template, GenericHarness())
    user = Message(Role.USER, (TextBlock("write a long essay"),))
    p1 = ing.prepare("ex", "run", ChatRequest(system="sys", messages=(user,)))
    answer = Message(Role.ASSISTANT, (TextBlock("The essay begins"),))
    cut = template.render_output(answer).ids[:-1]  # max_tokens hit: no <|im_end|>
    ing.record(
        p1,
        request_id="r1",
        output_ids=np.array(cut, np.int32),
        output_logprobs=np.full(len(cut), -0.5, np.float32),
        assistant=answer,
        finish=CallFinish.LENGTH,
    )
    nxt = ChatRequest(system="sys", messages=(user, answer, Message(Role.USER, (TextBlock("go on"),))))
    p2 = ing.prepare("ex", "run", nxt)
    # The stored prefix stops before the truncated answer; the answer is rendered whole.
    assert p2.encoded.prefix is not None and not p2.encoded.prefix.after_output
    assert p2.encoded.prefix_len < p1.encoded.input_len + len(cut)
    assert template.im_end in p2.encoded.new_ids.tolist()
