"""Message-chain hashes kept per execution: always the whole chain's hash, at the cost of the new messages."""

from __future__ import annotations

import dataclasses

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre_proxy.chat import (
    Message,
    Role,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    chain_hashes,
    system_message,
    system_sha,
)
from gyre_proxy.harness import ClaudeCodeHarness
from gyre_proxy.ingest import ChainCache, Ingestor, Qwen3Template, TraceConfig, TraceGenerator
from gyre_proxy.ingest.chains import text_size
from gyre_store import InMemoryEventLog
from gyre_store.catalog import TitoArrays
from gyre_store.trees import TrajectoryRecorder

BRANCHY = TraceConfig(
    seed=5,
    main_requests=60,
    compact_at=9_000,
    subagents=2,
    subagent_requests=(6, 10),
    subagent_compact_at=2_000,
    retry_every=17,
    tool_result_words=(30, 250),
    interrupt_at=7,
)


def copy(messages: list[Message]) -> list[Message]:
    """The same messages as new objects, as a harness's next request parses them."""
    return msgspec.json.decode(msgspec.json.encode(messages), type=list[Message])


def message(kind: int, n: int) -> Message:
    if kind == 0:
        return Message(Role.USER, (TextBlock(f"user turn {n}"),))
    if kind == 1:
        return Message(
            Role.ASSISTANT,
            (ThinkingBlock(f"think {n}"), ToolUseBlock(f"call_{n}", "Bash", f'{{"cmd": "ls {n}"}}')),
        )
    return Message(Role.USER, (ToolResultBlock(f"call_{n}", "x" * (n % 7) + f"result {n}"),))


# One step of a harness: append a message, compact (a fresh chain from the system message and a
# summary), branch (a sub-agent, or a retry with an edited tail, from an earlier point), resend
# the chain unchanged, or resend it with the thinking dropped (unequal objects, equal hashes).
STEP = st.tuples(st.sampled_from(["append", "compact", "branch", "resend", "unthink"]), st.integers(0, 2))


@settings(max_examples=60, deadline=None)
@given(st.lists(STEP, min_size=1, max_size=40), st.integers(1, 3))
def test_chains_grown_message_by_message_hash_as_the_whole_chain(
    steps: list[tuple[str, int]], kept: int
) -> None:
    cache = ChainCache(chains=kept)
    system = system_message("You are a coding agent.", ())
    chain = [system]
    sent_messages = 0
    for n, (op, kind) in enumerate(steps):
        if op == "append":
            chain = [*chain, message(kind, n)]
        elif op == "compact":
            chain = [system, Message(Role.USER, (TextBlock(f"summary {n}"),))]
        elif op == "branch":
            chain = [*chain[: 1 + kind % len(chain)], message(kind, n)]
        elif op == "unthink":
            chain = [
                Message(m.role, tuple(b for b in m.blocks if not isinstance(b, ThinkingBlock))) for m in chain
            ]
        sent = copy(chain)
        hashes, sha = cache.hashes("ex", sent)
        assert list(hashes) == chain_hashes(sent)
        assert sha == system_sha(sent[0])
        sent_messages += len(sent)
        kept_chains = [c for cs in cache._by_execution.values() for c in cs]
        assert all(c.chars == sum(text_size(m) for m in c.messages) for c in kept_chains)
        assert cache.chars == sum(c.chars for c in kept_chains)
    assert cache.hashed + cache.reused == sent_messages
    assert cache.reused >= len(steps) - 1  # each request after the first shared its system message


def test_a_request_that_extends_the_last_hashes_only_its_new_messages() -> None:
    cache = ChainCache()
    chain = [system_message("sys", ()), *(message(k % 3, k) for k in range(30))]
    cache.hashes("ex", copy(chain[:20]))
    assert (cache.hashed, cache.reused) == (20, 0)
    hashes, _ = cache.hashes("ex", copy(chain))
    assert (cache.hashed, cache.reused) == (31, 20)  # a system message and 30 more
    assert list(hashes) == chain_hashes(chain)
    cache.hashes("other", copy(chain))  # executions do not share chains
    assert cache.hashed == 62


def test_the_cache_keeps_a_bounded_number_of_executions_and_chains() -> None:
    cache = ChainCache(executions=2, chains=1)
    chain = [system_message("sys", ()), *(message(k % 3, k) for k in range(5))]
    for ex in ("a", "b", "c"):
        cache.hashes(ex, copy(chain))
    hashed = cache.hashed
    assert list(cache.hashes("a", copy(chain))[0]) == chain_hashes(chain)  # "a" was evicted
    assert cache.hashed == hashed + len(chain)
    cache.forget("a")
    cache.hashes("a", copy(chain))
    assert cache.hashed == hashed + 2 * len(chain)
    with pytest.raises(ValueError, match="empty"):
        cache.hashes("a", [])
    with pytest.raises(ValueError, match="at least one"):
        ChainCache(chains=0)


def test_the_cache_keeps_its_chains_text_under_max_chars_the_least_recently_used_going_first() -> None:
    chain = [system_message("sys", ()), Message(Role.USER, (TextBlock("x" * 1000),))]
    size = sum(text_size(m) for m in chain)
    cache = ChainCache(max_chars=2 * size + 10)  # two executions' chains fit, not three
    for ex in ("a", "b"):
        cache.hashes(ex, copy(chain))
    cache.hashes("a", copy(chain))  # "a" is now the more recently used
    cache.hashes("c", copy(chain))
    assert cache.chars == 2 * size and cache.evicted_for_chars == 1
    hashed = cache.hashed
    cache.hashes("a", copy(chain))  # kept: nothing hashed
    assert cache.hashed == hashed
    cache.hashes("b", copy(chain))  # evicted: hashed whole, and the same hashes
    assert cache.hashed == hashed + len(chain)
    big = [*chain, Message(Role.USER, (TextBlock("y" * 10_000),))]
    assert list(cache.hashes("d", copy(big))[0]) == chain_hashes(big)  # larger than the bound: kept alone
    assert cache.chars == sum(text_size(m) for m in big) and list(cache._by_execution) == ["d"]
    with pytest.raises(ValueError, match="max_chars"):
        ChainCache(max_chars=-1)


def trace(template: Qwen3Template, cached: bool) -> tuple[list[bytes], list[TitoArrays], Ingestor]:
    log = InMemoryEventLog()
    ingestor = Ingestor(TrajectoryRecorder(log), template, ClaudeCodeHarness())
    if not cached:
        ingestor.chains = None
    TraceGenerator(ingestor, BRANCHY).run("ex", "run")
    events = log.read(0, limit=100_000)
    bodies = [msgspec.json.encode(msgspec.structs.replace(e.event, started_at=0.0)) for e in events]
    return bodies, [TitoArrays.from_payload(e.payload) for e in events], ingestor


def test_a_branchy_execution_is_stored_the_same_with_the_cache_as_without(template: Qwen3Template) -> None:
    """Compactions, sub-agents, retries and an interrupted call: identical records either way."""
    bodies, arrays, ingestor = trace(template, cached=True)
    plain_bodies, plain_arrays, _ = trace(template, cached=False)
    assert bodies == plain_bodies
    assert len(arrays) == len(plain_arrays) > 60
    for a, b in zip(arrays, plain_arrays, strict=True):
        for f in dataclasses.fields(TitoArrays):
            assert np.array_equal(getattr(a, f.name), getattr(b, f.name)), f.name
    assert ingestor.chains is not None
    assert ingestor.chains.reused > 5 * ingestor.chains.hashed  # the history was not rehashed
