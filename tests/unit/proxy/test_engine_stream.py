"""Stream accumulation: cumulative and incremental SGLang chunks give the same increments."""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gyre_proxy.engines import FinishKind
from gyre_proxy.engines.stream import StreamAccumulator, iter_sse_data
from gyre_proxy.exceptions import ContextLengthExceeded, EngineProtocolError


def chunk(ids: list[int], logprobs: list[float], total: int, finish: dict[str, object] | None) -> str:
    meta = {
        "id": "r",
        "completion_tokens": total,
        "weight_version": "w",
        "finish_reason": finish,
        "output_token_logprobs": [[lp, token, None] for lp, token in zip(logprobs, ids, strict=True)],
    }
    return json.dumps({"text": None, "output_ids": ids, "meta_info": meta})


def chunks(ids: list[int], cuts: list[int], *, incremental: bool) -> list[str]:
    logprobs = [-float(i) / 8 for i in range(len(ids))]
    bounds = sorted({0, *cuts, len(ids)})
    out = []
    for start, end in itertools.pairwise(bounds):
        lo = start if incremental else 0
        finish = {"type": "length", "length": len(ids)} if end == len(ids) else None
        out.append(chunk(ids[lo:end], logprobs[lo:end], end, finish))
    return out


@given(
    ids=st.lists(st.integers(0, 300), min_size=1, max_size=40),
    cuts=st.lists(st.integers(1, 39), max_size=10),
)
def test_cumulative_and_incremental_streams_agree(ids: list[int], cuts: list[int]) -> None:
    cuts = [cut for cut in cuts if cut < len(ids)]
    results = []
    for incremental in (False, True):
        accumulator = StreamAccumulator("r")
        deltas = [accumulator.feed(payload) for payload in chunks(ids, cuts, incremental=incremental)]
        got = [d for d in deltas if d is not None]
        assert accumulator.finished
        results.append(([d.output_ids.tolist() for d in got], [d.logprobs.tolist() for d in got]))
    assert results[0] == results[1]
    assert [token for delta_ids in results[0][0] for token in delta_ids] == ids


def test_final_chunk_without_new_tokens_still_finishes() -> None:
    accumulator = StreamAccumulator("r")
    accumulator.feed(chunk([5, 6], [-1.0, -2.0], 2, None))
    delta = accumulator.feed(chunk([5, 6], [-1.0, -2.0], 2, {"type": "abort", "message": "x"}))
    assert delta is not None and delta.output_ids.tolist() == []
    assert delta.finish is not None and delta.finish.kind is FinishKind.ABORT


def test_error_chunk_is_typed() -> None:
    payload = json.dumps(
        {"error": {"message": "The input (9 tokens) is longer than the model's context length (8 tokens)."}}
    )
    with pytest.raises(ContextLengthExceeded):
        StreamAccumulator("r").feed(payload)


def test_chunk_with_missing_tokens_is_a_protocol_error() -> None:
    with pytest.raises(EngineProtocolError):
        StreamAccumulator("r").feed(chunk([1], [-1.0], 3, None))


def test_missing_logprobs_is_a_protocol_error() -> None:
    payload = json.dumps({"output_ids": [1], "meta_info": {"id": "r", "completion_tokens": 1}})
    with pytest.raises(EngineProtocolError, match="return_logprob"):
        StreamAccumulator("r").feed(payload)


@pytest.mark.anyio
async def test_sse_lines_stop_at_done() -> None:
    body = b'data: {"a": 1}\r\n\n: comment\ndata: [DONE]\n\ndata: {"late": 1}\n\n'
    for size in (1, 3, len(body)):
        chunks = chunked([body[i : i + size] for i in range(0, len(body), size)])
        assert [payload async for payload in iter_sse_data(chunks)] == [b'{"a": 1}']
        # what follows [DONE] is left for the caller to read (and so reuse the connection)
        rest = b"".join([piece async for piece in chunks])
        assert body.endswith(rest) and (size > 1 or rest.startswith(b"\ndata: {"))


@pytest.mark.anyio
@given(
    payloads=st.lists(st.text("ab {}:[]é", max_size=30), max_size=6),
    cuts=st.lists(st.integers(0, 400), max_size=8),
)
async def test_sse_lines_survive_any_chunking(payloads: list[str], cuts: list[int]) -> None:
    payloads = [p.strip() for p in payloads if p.strip() and p.strip() != "[DONE]"]
    body = "".join(f"data: {p}\n\n" for p in payloads).encode()
    bounds = sorted({0, *[c for c in cuts if c < len(body)], len(body)})
    chunks = chunked([body[a:b] for a, b in itertools.pairwise(bounds)])
    assert [p async for p in iter_sse_data(chunks)] == [p.encode() for p in payloads]


async def chunked(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk
