"""The answer loop as a pure state machine, driven by hand: no engine, no event loop, no clock.

A character tokenizer (one token per byte) makes every engine chunk exactly the text it
carries, so the tests choose where chunks split.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gyre_proxy.answer import AnswerMachine, GiveUp, Reroute, Stage, StopEngine
from gyre_proxy.chat import ChatRequest, Message, MessageDone, Role, StopReason, TextBlock, TextDelta
from gyre_proxy.engines import Finish, FinishKind, GenerateDelta, qwen_tokenizer
from gyre_proxy.harness import GenericHarness
from gyre_proxy.ingest import Ingestor, Prepared, Qwen3Template
from gyre_store import InMemoryEventLog
from gyre_store.catalog import CallFinish
from gyre_store.trees import PrefixPoint, TrajectoryRecorder

SPECIALS = ("<|im_end|>", "<|endoftext|>")
EOS = 256


class CharTokenizer:
    """UTF-8 bytes as ids 0-255, then the two stop tokens."""

    name = "chars"

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        return bytes(i for i in ids if i < 256)

    def decode(self, ids: Sequence[int]) -> str:
        return self.decode_bytes(ids).decode(errors="replace")

    def special(self, token: str) -> int:
        return 256 + SPECIALS.index(token)

    @property
    def vocab_size(self) -> int:
        return 256 + len(SPECIALS)


TOK = CharTokenizer()


@pytest.fixture(scope="module")
def prepared() -> Prepared:
    ingestor = Ingestor(
        TrajectoryRecorder(InMemoryEventLog()), Qwen3Template(qwen_tokenizer()), GenericHarness()
    )
    request = ChatRequest(system="s", messages=(Message(Role.USER, (TextBlock("go"),)),))
    return ingestor.prepare("ex", "run", request)


def machine_for(prepared: Prepared, *, stop: tuple[str, ...] = (), max_tokens: int = 100) -> AnswerMachine:
    request = ChatRequest(
        system="s", messages=(Message(Role.USER, (TextBlock("go"),)),), stop=stop, max_tokens=max_tokens
    )
    return AnswerMachine(
        request,
        prepared,
        prepared.encoded.new_ids,
        request_id="req-1",
        tokenizer=TOK,
        stop_ids=(EOS, EOS + 1),
    )


def delta(
    text: str = "", *, version: str | None = "1", finish: FinishKind | None = None, eos: bool = False
) -> GenerateDelta:
    ids = TOK.encode(text) + ([EOS] if eos else [])
    return GenerateDelta(
        rid="",
        output_ids=np.asarray(ids, dtype=np.int32),
        logprobs=np.full(len(ids), -0.5, dtype=np.float32),
        finish=None if finish is None else Finish(finish),
        weight_version=version,
    )


def sent_text(effects: Sequence[object]) -> str:
    return "".join(e.text for e in effects if isinstance(e, TextDelta))


def staged(effects: Sequence[object]) -> list[Stage]:
    return [e for e in effects if isinstance(e, Stage)]


@pytest.mark.parametrize("interruption", ["engine error", "engine abort"])
def test_a_reroute_mid_answer_continues_from_what_the_harness_has(
    prepared: Prepared, interruption: str
) -> None:
    machine = machine_for(prepared, max_tokens=50)
    first = machine.start("e0")
    assert first.rid == "req-1-a0" and first.sampling.max_new_tokens == 50
    effects = [*machine.on_delta(delta("Hello")), *machine.on_delta(delta(" wor"))]
    if interruption == "engine error":
        machine.fail()
    else:
        effects += machine.on_delta(delta(finish=FinishKind.ABORT))
    ending = machine.end_attempt()
    assert not machine.completed
    [interrupted] = staged(ending)
    assert ending[-1] == Reroute("e0")
    assert sent_text(effects) == "Hello wor"  # what the harness has: in the record, delivered
    assert TOK.decode(interrupted.output_ids.tolist()) == "Hello wor"
    assert (interrupted.request_id, interrupted.finish, interrupted.delivered) == (
        "req-1-a0",
        CallFinish.ABORT,
        True,
    )
    assert interrupted.retry_of is None and interrupted.assistant is None

    second = machine.start("e1")
    assert second.rid == "req-1-a1"
    assert second.context.tolist() == [*prepared.encoded.new_ids.tolist(), *TOK.encode("Hello wor")]
    assert second.sampling.max_new_tokens == 50 - len("Hello wor")
    effects += machine.on_delta(delta("ld", eos=True, finish=FinishKind.STOP))
    ending = machine.end_attempt()
    assert machine.completed
    assert sent_text(effects + ending) == "Hello world"  # nothing repeated, nothing lost
    [final] = staged(ending)
    assert TOK.decode(final.output_ids.tolist()) == "ld"
    assert final.retry_of == "req-1-a0" and final.engine == "e1" and final.finish is CallFinish.STOP
    assert final.prepared.encoded.prefix == PrefixPoint(
        "req-1-a0", prepared.encoded.input_len + len("Hello wor"), True
    )
    assert final.assistant == Message(Role.ASSISTANT, (TextBlock("Hello world"),))
    done = ending[-1]
    assert isinstance(done, MessageDone) and done.output_tokens == len("Hello world") + 1


def test_the_answer_gives_up_after_its_last_attempt(prepared: Prepared) -> None:
    machine = machine_for(prepared)
    for attempt in range(4):
        machine.start(f"e{attempt}")
        machine.on_delta(delta("x"))
        machine.fail()
        ending = machine.end_attempt()
        assert (GiveUp() in ending) == (attempt == 3)
        assert [s.request_id for s in staged(ending)] == [f"req-1-a{attempt}"]
    assert not machine.completed


def test_a_stop_sequence_split_across_chunks_never_reaches_the_harness(prepared: Prepared) -> None:
    machine = machine_for(prepared, stop=("STOP",))
    machine.start("e0")
    effects: list[object] = []
    for chunk in ("ab", "cS", "TO", "Pxyz"):
        step = machine.on_delta(delta(chunk))
        assert "S" not in sent_text(step)
        effects += step
    assert effects[-1] == StopEngine("req-1-a0")  # the engine is told to stop at once
    assert machine.stop_sequence == "STOP"
    ending = machine.end_attempt()
    assert machine.completed and sent_text(effects + ending) == "abc"
    done = ending[-1]
    assert isinstance(done, MessageDone)
    assert (done.stop_reason, done.stop_sequence) == (StopReason.STOP_SEQUENCE, "STOP")
    [record] = staged(ending)
    assert TOK.decode(record.output_ids.tolist()) == "abcSTOPxyz"  # what was sampled, all of it


def test_held_back_text_is_released_when_no_stop_sequence_follows(prepared: Prepared) -> None:
    machine = machine_for(prepared, stop=("STOP",))
    machine.start("e0")
    assert sent_text(machine.on_delta(delta("abST"))) == "a"  # "bST" could still begin "STOP"
    assert sent_text(machine.on_delta(delta(eos=True, finish=FinishKind.STOP))) == ""
    assert sent_text(machine.end_attempt()) == "bST"


@given(
    text=st.text(alphabet="abSTOP", max_size=30),
    cuts=st.lists(st.integers(min_value=0, max_value=30), max_size=8),
)
def test_any_chunking_sends_the_text_up_to_the_stop_sequence(
    prepared: Prepared, text: str, cuts: list[int]
) -> None:
    machine = machine_for(prepared, stop=("STOP",))
    machine.start("e0")
    bounds = sorted({0, len(text), *(c for c in cuts if c < len(text))})
    effects: list[object] = []
    for a, b in itertools.pairwise(bounds):
        effects += machine.on_delta(delta(text[a:b]))
        if machine.stop_sequence is not None:
            break
    else:
        effects += machine.on_delta(delta(eos=True, finish=FinishKind.STOP))
    effects += machine.end_attempt()
    expected = text[: text.find("STOP")] if "STOP" in text else text
    assert sent_text(effects) == expected


def test_weight_version_spans_count_from_each_records_first_token(prepared: Prepared) -> None:
    machine = machine_for(prepared)
    machine.start("e0")
    machine.on_delta(delta("ab", version="3"))
    machine.on_delta(delta("cd", version="4"))
    machine.fail()
    [first] = staged(machine.end_attempt())
    assert first.weight_versions == ((0, 3), (2, 4))
    machine.start("e1")
    machine.on_delta(delta("e", version="4"))
    machine.on_delta(delta("f", version="5"))
    machine.on_delta(delta("g", version="5", eos=True, finish=FinishKind.STOP))
    [second] = staged(machine.end_attempt())
    # The version in force when the continuation began (4) comes first, at offset 0.
    assert second.weight_versions == ((0, 4), (1, 5))


def test_a_harness_gone_mid_answer_stops_the_engine_and_keeps_the_tokens(prepared: Prepared) -> None:
    machine = machine_for(prepared)
    machine.start("e0")
    machine.on_delta(delta("partial"))
    stop, record = machine.cut()
    assert stop == StopEngine("req-1-a0")
    assert isinstance(record, Stage)
    assert (record.request_id, record.finish, record.delivered, record.engine) == (
        "req-1-cut",
        CallFinish.ABORT,
        False,
        "e0",
    )
    assert TOK.decode(record.output_ids.tolist()) == "partial"
    assert machine.cut() == []  # once is enough


def test_a_completed_answer_has_nothing_to_cut(prepared: Prepared) -> None:
    machine = machine_for(prepared)
    machine.start("e0")
    machine.on_delta(delta("done", eos=True, finish=FinishKind.LENGTH))
    [record] = staged(machine.end_attempt())
    assert record.finish is CallFinish.LENGTH and record.request_id == "req-1"
    assert record.sequence.tolist() == [*prepared.encoded.new_ids.tolist(), *TOK.encode("done"), EOS]
    assert machine.cut() == []
