"""One harness call's answer as a pure state machine: engine deltas, finishes and failures
in; the harness's stream events, engine stops, reroutes and staged records out.

``AnswerMachine`` keeps what must survive a change of engine mid-answer: every token the
harness has received (a reroute continues from there), the stop-sequence hold-back over the
decoded text, the weight versions the tokens were sampled under, and which attempt each
record continues. It does no I/O, knows no asyncio and reads no clock; ``AnswerPipeline``
routes, streams from engines and stages records, doing what each returned effect says. A
weight version that names no policy version is refused (``WeightVersionInvalid``), never
guessed: the tokens' version is what training's staleness and ratios are computed from.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gyre_proxy.answer.output_parser import parser_for
from gyre_proxy.chat import Block, ChatRequest, Message, Role, StreamEvent
from gyre_proxy.engines import FinishKind, GenerateDelta, IncrementalText, SamplingConfig, Tokenizer
from gyre_proxy.exceptions import WeightVersionInvalid
from gyre_proxy.ingest import Prepared, continuation
from gyre_store.catalog import CallFinish

MAX_ATTEMPTS = 4


@dataclass(frozen=True, slots=True, eq=False)
class Attempt:
    """What to ask the next engine: request ``rid`` over ``context`` (the input and every
    token the harness already has), sampling at most the tokens the answer has left."""

    rid: str
    context: npt.NDArray[np.int32]
    sampling: SamplingConfig


@dataclass(frozen=True, slots=True)
class StopEngine:
    """Abort request ``rid`` on its engine and read no more of it."""

    rid: str


@dataclass(frozen=True, slots=True)
class Reroute:
    """Engine ``engine`` failed this answer mid-way: let routing move the execution, then
    start the next attempt."""

    engine: str


@dataclass(frozen=True, slots=True)
class GiveUp:
    """No engine finished the answer within ``MAX_ATTEMPTS`` attempts."""


@dataclass(frozen=True, slots=True, eq=False)
class Stage:
    """Stage the record of one attempt, which produced ``output_ids``.

    ``delivered`` says whether the harness received those tokens; ``weight_versions`` are
    (offset into ``output_ids``, version) spans; ``sequence`` is the attempt's full token
    sequence (the input, then every output token up to its end), for later prefixes;
    ``detail`` says why an attempt ended early (the engine's error or abort, the harness
    gone), empty for a finished answer.
    """

    prepared: Prepared
    request_id: str
    output_ids: npt.NDArray[np.int32]
    output_logprobs: npt.NDArray[np.float32]
    assistant: Message | None
    finish: CallFinish
    delivered: bool
    engine: str
    weight_versions: tuple[tuple[int, int], ...]
    retry_of: str | None
    sequence: npt.NDArray[np.int32]
    detail: str = ""


class AnswerMachine:
    """The answer to ``request`` over ``input_ids``, across as many engine attempts as it takes.

    Drive it as: ``start(engine)``; ``on_delta`` for each streamed delta (stop reading once
    it returns ``StopEngine``); ``fail(why)`` if the engine failed mid-stream, or if
    ``on_delta`` refused a delta (then abort the request: the engine is still generating);
    ``end_attempt()`` when the stream is over. Repeat until ``completed`` (or ``GiveUp``).
    ``cut()`` says what to do when the harness goes away first.
    """

    def __init__(
        self,
        request: ChatRequest,
        prepared: Prepared,
        input_ids: npt.NDArray[np.int32],
        *,
        request_id: str,
        tokenizer: Tokenizer,
        stop_ids: tuple[int, ...],
        family: str = "qwen",
        thinking_open: bool = False,
        max_attempts: int = MAX_ATTEMPTS,
    ) -> None:
        self.request = request
        self.request_id = request_id
        self.input_ids = input_ids
        self.completed = False
        self.stop_sequence: str | None = None  # the request's stop sequence that ended the answer
        self._prepared = prepared
        self._stop_ids = stop_ids
        self._max_attempts = max_attempts
        self._parser = parser_for(family)(thinking_open=thinking_open)  # the template's family reads it
        self._decoded = IncrementalText(tokenizer, skip=stop_ids)  # the output's visible text
        self._sent = 0  # characters of it fed to the parser (the harness has them)
        # Text that could be the start of a stop sequence is held back this many characters.
        self._hold = max((len(s) for s in request.stop), default=1) - 1
        self._out_ids: list[int] = []  # every token the harness has received, across attempts
        self._out_lp: list[float] = []
        self._versions: list[tuple[int, int]] = []  # (index into _out_ids, version) at each change
        self._finish = FinishKind.STOP
        self._attempts = 0
        self._rid: str | None = None
        self._engine = ""
        self._interrupted = False
        self._detail = ""  # why the current attempt was interrupted, for its record
        self._attempt_prepared = prepared  # what the current attempt's record extends
        self._attempt_start = 0  # index into _out_ids where the current attempt began
        self._retry_of: str | None = None

    @property
    def blocks(self) -> tuple[Block, ...]:
        """The answer's content blocks (all of them once ``completed``)."""
        return self._parser.blocks

    def start(self, engine: str) -> Attempt:
        """Begin the next attempt, on ``engine``."""
        assert not self.completed and self._attempts < self._max_attempts, "no attempt is left to start"
        self._rid = f"{self.request_id}-a{self._attempts}"
        self._attempts += 1
        self._engine = engine
        self._interrupted = False
        self._detail = ""
        context = self.input_ids
        if self._out_ids:
            context = np.concatenate([self.input_ids, np.asarray(self._out_ids, dtype=np.int32)])
        sampling = SamplingConfig(
            max_new_tokens=max(1, self.request.max_tokens - len(self._out_ids)),
            temperature=self.request.temperature,
            top_p=self.request.top_p,
            stop_token_ids=self._stop_ids,
        )
        return Attempt(self._rid, context, sampling)

    def on_delta(self, delta: GenerateDelta) -> list[StreamEvent | StopEngine]:
        """The events the harness gets for ``delta``; a last ``StopEngine`` when a stop
        sequence ended the answer (the rest of ``delta`` is then ignored).

        Raises ``WeightVersionInvalid``, taking none of ``delta``, when its weight version
        names no policy version, or none after the answer's tokens had one (spans cannot say
        "unknown from here"): nothing reached the harness from it.
        """
        out: list[StreamEvent | StopEngine] = []
        version = policy_version(delta.weight_version)
        if version is None:
            if self._versions:
                raise WeightVersionInvalid(
                    f"weight_version {delta.weight_version!r} after version {self._versions[-1][1]} "
                    "in the same answer: the rest would have no known version"
                )
        elif not self._versions or self._versions[-1][1] != version:
            self._versions.append((len(self._out_ids), version))
        if delta.output_ids.shape[0]:
            new_ids = delta.output_ids.tolist()
            self._out_ids.extend(new_ids)
            self._out_lp.extend(delta.logprobs.tolist())
            # Only the new tokens are decoded: re-decoding the whole output on every chunk
            # made a long answer quadratic.
            text = self._decoded.add(new_ids)
            if len(text) > self._sent and not text.endswith("\ufffd"):
                hit = _find_stop(text, self.request.stop, self._sent)
                # Hold back what could be the start of a stop sequence, so the harness never
                # receives part of one.
                cut = hit[1] if hit is not None else max(self._sent, len(text) - self._hold)
                out.extend(self._parser.feed(text[self._sent : cut]))
                self._sent = cut
                if hit is not None:
                    self.stop_sequence = hit[0]
                    out.append(StopEngine(self._require_rid()))
                    return out
        if delta.finish is not None:
            if delta.finish.kind == FinishKind.ABORT:
                self._interrupted = True  # aborted by the engine: a role transition
                self._detail = f"aborted by engine {self._engine}: {delta.finish.message or 'no message'}"
            else:
                self._finish = delta.finish.kind
        return out

    def fail(self, why: str = "") -> None:
        """The engine failed mid-stream (unavailable, not accepting, a broken stream, a delta
        refused); ``why`` goes on the attempt's record."""
        self._interrupted = True
        self._detail = why

    def end_attempt(self) -> list[StreamEvent | Stage | Reroute | GiveUp]:
        """The attempt's stream is over: either the answer is complete (the held text, the
        closing events and the final record), or the attempt is recorded and the answer
        continues elsewhere (``Stage``, ``Reroute``, and ``GiveUp`` when none is left)."""
        if self.stop_sequence is None and self._interrupted:
            return self._reroute()
        self.completed = True
        out: list[StreamEvent | Stage | Reroute | GiveUp] = []
        if self.stop_sequence is None:
            held = self._decoded.finish()[self._sent :]
            if held:
                out.extend(self._parser.feed(held))
        closing = self._parser.finish(
            self._finish,
            input_tokens=int(self.input_ids.shape[0]),
            output_tokens=len(self._out_ids),
            stop_sequence=self.stop_sequence,
        )
        finish = CallFinish.LENGTH if self._finish == FinishKind.LENGTH else CallFinish.STOP
        assistant = Message(Role.ASSISTANT, self._parser.blocks)
        out.append(self._stage(self.request_id, assistant, finish, delivered=True))
        out.extend(closing)
        return out

    def cut(self) -> list[StopEngine | Stage]:
        """The harness went away mid-answer: stop the engine and keep what was sampled, as an
        undelivered record. Nothing once the answer is complete."""
        if self.completed:
            return []
        self.completed = True
        out: list[StopEngine | Stage] = [] if self._rid is None else [StopEngine(self._rid)]
        out.append(
            self._stage(
                f"{self.request_id}-cut",
                None,
                CallFinish.ABORT,
                delivered=False,
                detail="the harness went away",
            )
        )
        return out

    def _reroute(self) -> list[StreamEvent | Stage | Reroute | GiveUp]:
        # The harness has this attempt's tokens: record them, and continue from them.
        rid = self._require_rid()
        out: list[StreamEvent | Stage | Reroute | GiveUp] = [
            self._stage(rid, None, CallFinish.ABORT, delivered=True, detail=self._detail),
            Reroute(self._engine),
        ]
        self._attempt_prepared = continuation(self._prepared, rid, len(self._out_ids))
        self._retry_of = rid
        self._attempt_start = len(self._out_ids)
        if self._attempts >= self._max_attempts:
            out.append(GiveUp())
        return out

    def _stage(
        self,
        request_id: str,
        assistant: Message | None,
        finish: CallFinish,
        *,
        delivered: bool,
        detail: str = "",
    ) -> Stage:
        """The record of the attempt that produced ``_out_ids[_attempt_start:]``.

        Weight-version spans are per record: offsets count from this attempt's first token,
        and the version in force when it began comes first.
        """
        start = self._attempt_start
        spans = [(0, v) for o, v in self._versions if o <= start][-1:] + [
            (o - start, v) for o, v in self._versions if o > start
        ]
        return Stage(
            prepared=self._attempt_prepared,
            request_id=request_id,
            output_ids=np.asarray(self._out_ids[start:], dtype=np.int32),
            output_logprobs=np.asarray(self._out_lp[start:], dtype=np.float32),
            assistant=assistant,
            finish=finish,
            delivered=delivered,
            engine=self._engine,
            weight_versions=tuple(spans),
            retry_of=self._retry_of,
            sequence=np.concatenate([self.input_ids, np.asarray(self._out_ids, dtype=np.int32)]),
            detail=detail,
        )

    def _require_rid(self) -> str:
        assert self._rid is not None, "an attempt is under way"
        return self._rid


# SGLang's weight version of a server started without ``--weight-version`` and never updated.
UNVERSIONED = "default"


def policy_version(reported: str | None) -> int | None:
    """The policy version an engine's ``meta_info.weight_version`` names.

    gyre's engines serve integer versions as decimal strings ("3"). ``None`` (an SGLang
    without the field) and ``"default"`` (an engine nobody gave a version) name none: the
    tokens get no span, and a record without spans has no policy version (NULL in
    ``gyre_records``, from the event's metadata), never 0, which is the initial policy.
    Raises ``WeightVersionInvalid`` for anything else ("abc", "1.5", "", "-1", " 3").
    """
    if reported is None or reported == UNVERSIONED:
        return None
    # ASCII digits only: int() would also take "+3", " 3", "3_0" and other scripts' digits.
    if not (reported.isascii() and reported.isdigit()):
        raise WeightVersionInvalid(f"weight_version {reported!r} is not an integer policy version")
    return int(reported)


def _find_stop(text: str, stops: tuple[str, ...], since: int) -> tuple[str, int] | None:
    best: tuple[str, int] | None = None
    for s in stops:
        i = text.find(s, max(0, since - len(s)))
        if i >= 0 and (best is None or i < best[1]):
            best = (s, i)
    return best
