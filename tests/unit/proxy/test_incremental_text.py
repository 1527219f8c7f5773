"""The streamed answer's text is decoded incrementally: same text as decoding it whole,
split characters held until complete, and work linear in the answer's length."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre_proxy.answer import AnswerPipeline, Router
from gyre_proxy.chat import ChatRequest, ExecutionAuth, Message, Role, TextBlock
from gyre_proxy.engines import IncrementalText, QwenTokenizer, qwen_tokenizer
from gyre_proxy.engines.testing import FakeEngine
from gyre_proxy.harness import GenericHarness
from gyre_proxy.ingest import Ingestor, Qwen3Template, RecordSpool
from gyre_store import InMemoryEventLog
from gyre_store.trees import TrajectoryRecorder

TEXT = "Plan: naïve café — 日本語のテキスト 🚀 résumé; then run `ls`. "


@pytest.fixture(scope="module")
def tok() -> QwenTokenizer:
    return qwen_tokenizer()


@settings(max_examples=60)
@given(
    st.lists(st.integers(0, 248_000), max_size=40),  # arbitrary tokens: partial and invalid UTF-8
    st.lists(st.integers(1, 5), min_size=1, max_size=40),
)
def test_incremental_text_is_a_prefix_and_ends_equal_to_whole_decoding(
    ids: list[int], cuts: list[int]
) -> None:
    tok = qwen_tokenizer()
    end = tok.special("<|im_end|>")
    ids = [*tok.encode(TEXT)[:7], *ids, end]
    text = IncrementalText(tok, skip={end})
    start = 0
    for k in cuts * (len(ids) // len(cuts) + 1):
        chunk = ids[start : start + k]
        if not chunk:
            break
        start += len(chunk)
        so_far = tok.decode([i for i in ids[:start] if i != end])
        assert so_far.startswith(text.add(chunk))
    assert text.finish() == tok.decode(ids[:-1])


def test_one_token_bytes_remembered_match_the_bpe_core(tok: QwenTokenizer) -> None:
    ids = tok.encode(TEXT + " 🚀 naïve")
    singles = [tok.decode_bytes([i]) for i in ids]  # the first sight of each id asks the core
    assert [tok.decode_bytes([i]) for i in ids] == singles  # the second is remembered
    assert b"".join(singles) == tok.decode_bytes(ids) == (TEXT + " 🚀 naïve").encode()


def test_a_character_split_across_tokens_waits_for_its_last_byte(tok: QwenTokenizer) -> None:
    rocket = "🚀".encode()
    pieces = [i for i in tok.encode("🚀")]
    assert b"".join(tok.decode_bytes([i]) for i in pieces) == rocket and len(pieces) > 1
    text = IncrementalText(tok)
    assert text.add(pieces[:-1]) == ""
    assert text.add(pieces[-1:]) == "🚀"


class CountingTokenizer:
    """The Qwen tokenizer, counting the tokens it is asked to decode."""

    def __init__(self, inner: QwenTokenizer) -> None:
        self.inner = inner
        self.name = inner.name
        self.decoded = 0

    def encode(self, text: str) -> list[int]:
        return self.inner.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        self.decoded += len(ids)
        return self.inner.decode(ids)

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        self.decoded += len(ids)
        return self.inner.decode_bytes(ids)

    def special(self, token: str) -> int:
        return self.inner.special(token)

    @property
    def specials(self) -> Mapping[str, int]:
        return self.inner.specials

    def byte_lengths(self, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        return self.inner.byte_lengths(ids)

    @property
    def vocab_size(self) -> int:
        return self.inner.vocab_size


def test_a_long_streamed_answer_is_decoded_once(tok: QwenTokenizer) -> None:
    counting = CountingTokenizer(tok)
    answer = (TEXT * 40).strip()
    ids = [*tok.encode(answer), tok.special("<|im_end|>")]
    engine = FakeEngine(script=[ids], context_length=1_000_000)  # one token per chunk
    recorder = TrajectoryRecorder(InMemoryEventLog())
    pipeline = AnswerPipeline(
        Ingestor(recorder, Qwen3Template(counting), GenericHarness()),
        Router([("e", engine)]),  # type: ignore[list-item]
        RecordSpool(recorder),
    )
    request = ChatRequest(system="s", messages=(Message(Role.USER, (TextBlock("go"),)),), max_tokens=5000)
    response = asyncio.run(pipeline.complete(ExecutionAuth("ex", "r", "generic"), request))
    pipeline.spool.close()
    assert response.blocks == (TextBlock(answer),)
    assert len(ids) > 400 and counting.decoded <= len(ids)  # re-decoding every chunk: ~n^2 / 2
