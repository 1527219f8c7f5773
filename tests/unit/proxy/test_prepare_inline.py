"""Preparing a request on the event loop or in a thread gives the same engine input and record.

The answer pipeline encodes an execution's next small turn inline and hands big or uncached ones
to a worker thread; the two paths must be indistinguishable from the engine and the log.
"""

from __future__ import annotations

import numpy as np
import pytest

from gyre_proxy.answer import AnswerPipeline, Router
from gyre_proxy.chat import (
    ChatRequest,
    ExecutionAuth,
    Message,
    Role,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    chain_hashes,
)
from gyre_proxy.engines.testing import FakeEngine
from gyre_proxy.harness import GenericHarness
from gyre_proxy.ingest import Ingestor, Qwen3Template, RecordSpool, encode_request, match_request, output_hash
from gyre_store import InMemoryEventLog
from gyre_store.catalog import TitoArrays
from gyre_store.log import StreamId
from gyre_store.trees import ExecutionContext, PrefixPoint, TrajectoryRecorder

pytestmark = pytest.mark.anyio

AUTH = ExecutionAuth("ex", "run", "generic")


def pipeline_over(
    template: Qwen3Template, **options: int
) -> tuple[AnswerPipeline, FakeEngine, InMemoryEventLog]:
    tok = template.tok
    answer = [*tok.encode("Done."), tok.special("<|im_end|>")]
    engine = FakeEngine(script=[answer], context_length=1_000_000)
    log = InMemoryEventLog()
    recorder = TrajectoryRecorder(log)
    pipeline = AnswerPipeline(
        Ingestor(recorder, template, GenericHarness()),
        Router([("e", engine)]),  # type: ignore[list-item]
        RecordSpool(recorder),
        **options,
    )
    return pipeline, engine, log


def turns() -> list[Message]:
    """A conversation whose fourth user turn carries a big tool result."""
    out: list[Message] = [Message(Role.USER, (TextBlock("list the files"),))]
    for n, size in enumerate((40, 60, 20_000, 30)):
        use = ToolUseBlock(f"toolu_{n}", "Bash", f'{{"command": "ls {n}"}}')
        out.append(Message(Role.ASSISTANT, (TextBlock("Done."), use)))
        out.append(Message(Role.USER, (ToolResultBlock(use.id, "x " * size),)))
    return out


async def run_conversation(pipeline: AnswerPipeline) -> None:
    history = turns()
    for end in range(1, len(history) + 1, 2):
        request = ChatRequest(system="You are an agent.", messages=tuple(history[:end]))
        await pipeline.complete(AUTH, request)


def stored(log: InMemoryEventLog) -> list[tuple[bytes, bytes, int]]:
    out = []
    for ev in log.read_stream(StreamId("calls", "ex")):
        a = TitoArrays.from_payload(ev.payload)
        out.append((a.input_ids.tobytes(), a.msg_hashes.tobytes(), ev.event.prefix_len))  # type: ignore[attr-defined]
    return out


async def test_inline_and_threaded_preparation_agree(template: Qwen3Template) -> None:
    inline, inline_engine, inline_log = pipeline_over(template)
    threaded, threaded_engine, threaded_log = pipeline_over(template, inline_chars=-1)
    await run_conversation(inline)
    await run_conversation(threaded)
    inline.spool.close()
    threaded.spool.close()
    # First turn: the execution is not in memory yet; the big tool result: over the limit.
    assert inline.prepared_inline == 3 and threaded.prepared_inline == 0
    assert [c.input_ids for c in inline_engine.calls] == [c.input_ids for c in threaded_engine.calls]
    assert stored(inline_log) == stored(threaded_log) and len(stored(inline_log)) == 5


async def test_an_evicted_execution_is_prepared_from_the_log(template: Qwen3Template) -> None:
    pipeline, engine, _ = pipeline_over(template, max_executions=1)
    history = turns()
    await pipeline.complete(AUTH, ChatRequest(system="s", messages=tuple(history[:1])))
    await pipeline.complete(AUTH, ChatRequest(system="s", messages=tuple(history[:3])))
    assert pipeline.prepared_inline == 1
    pipeline.spool.flush()  # an execution whose records wait in the spool is never evicted
    other = ExecutionAuth("other", "run", "generic")
    await pipeline.complete(other, ChatRequest(system="s", messages=tuple(history[:1])))  # evicts "ex"
    assert pipeline.ingestor.recorder.cached_context("ex") is None
    await pipeline.complete(AUTH, ChatRequest(system="s", messages=tuple(history[:5])))
    pipeline.spool.close()
    assert pipeline.prepared_inline == 1  # "ex" had to be reloaded, in a thread
    kept, kept_engine, _ = pipeline_over(template)
    for end in (1, 3, 5):
        await kept.complete(AUTH, ChatRequest(system="s", messages=tuple(history[:end])))
    kept.spool.close()
    assert kept.prepared_inline == 2
    assert engine.calls[-1].input_ids == kept_engine.calls[-1].input_ids


def test_output_hash_continues_the_request_chain(template: Qwen3Template) -> None:
    history = turns()
    request = ChatRequest(system="s", messages=tuple(history[:3]))
    encoded = encode_request(ExecutionContext("ex"), template, request)
    answer = history[3]
    whole = chain_hashes([*encoded.messages, answer])[-1]
    assert output_hash(encoded, answer).tobytes() == whole
    assert np.frombuffer(whole, "<u4").shape == (4,)


def test_pending_chars_counts_only_what_is_not_stored(template: Qwen3Template) -> None:
    ctx = ExecutionContext("ex")
    history = turns()
    request = ChatRequest(system="s", messages=tuple(history[:3]))
    fresh = match_request(ctx, request)
    tool_use = len("Done.") + len("Bash") + len('{"command": "ls 0"}')
    assert fresh.matched == 0 and fresh.pending_chars == len("s") + len("list the files") + tool_use + 80
    # System, user and assistant messages stored: only the tool result is left.
    ctx.index[fresh.hashes[2]] = PrefixPoint("r0", 10, True)
    partly = match_request(ctx, request)
    assert partly.matched == 3 and partly.prefix == PrefixPoint("r0", 10, True)
    assert partly.pending_chars == 80
    ctx.index[partly.context_hash] = PrefixPoint("r1", 30, False)
    assert match_request(ctx, request).pending_chars == 0
