"""The answer pipeline: a harness's model call in, the policy's answer out, a TITO record kept.

For each call: match and encode the request against the execution's tree (only new
messages are tokenized), route it to the execution's engine, stream the sampled tokens
through the output parser to the harness, and stage the record for the spool. When the
engine stops accepting, fails or aborts the request mid-answer, the pipeline records the
interrupted attempt and continues the same answer on another engine from the tokens the
harness already has, so the harness sees one uninterrupted response.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from gyre_proxy.answer.output_parser import OutputParser, stop_reason_for
from gyre_proxy.chat.answerer import ExecutionAuth, MessageDone, MessageStart, StreamEvent
from gyre_proxy.chat.messages import Block, ChatRequest, ChatResponse, Message, Role
from gyre_proxy.engines.tokenizer import IncrementalText
from gyre_proxy.engines.types import FinishKind, SamplingConfig
from gyre_proxy.exceptions import (
    ContextLengthExceeded,
    ContextTooLong,
    EngineBadRequest,
    EngineError,
    EngineUnavailable,
    Overloaded,
)
from gyre_proxy.ingest.incremental import Match
from gyre_proxy.ingest.ingestor import Ingestor, Prepared, continuation
from gyre_proxy.service.routing import RoutedEngine, Router
from gyre_proxy.service.spool import RecordSpool
from gyre_store.catalog.tito import CallFinish, ModelCallRecorded, TitoArrays
from gyre_store.log.events import StreamId
from gyre_store.trees.recorder import TrajectoryRecorder

MAX_ATTEMPTS = 4


@dataclass
class _Sequences:
    """Full token sequences (input + output) of an execution's recent records."""

    by_request: OrderedDict[str, npt.NDArray[np.int32]] = field(default_factory=OrderedDict)


class AnswerPipeline:
    """A :class:`~gyre_proxy.chat.answerer.Answerer` over engines, the store and a spool."""

    def __init__(
        self,
        ingestor: Ingestor,
        router: Router,
        spool: RecordSpool,
        *,
        context_limit: int = 131_072,
        keep_sequences: int = 8,
        max_executions: int = 4096,
        inline_chars: int = 8192,
    ) -> None:
        self.ingestor = ingestor
        self.router = router
        self.spool = spool
        self.context_limit = context_limit
        self.keep_sequences = keep_sequences
        self.max_executions = max_executions
        self.inline_chars = inline_chars
        self.prepared_inline = 0  # requests encoded on the event loop (the rest went to a thread)
        self._seqs: dict[str, _Sequences] = {}
        self._recent: OrderedDict[str, None] = OrderedDict()
        self.tok = ingestor.template.tok
        self._stop_ids = (self.tok.special("<|im_end|>"), self.tok.special("<|endoftext|>"))
        self.rerouted = 0

    # -- token sequences of stored records ---------------------------------------------------
    def _touch(self, execution_id: str) -> None:
        """Keep per-execution caches for the most recent executions only.

        An evicted execution is reloaded from the log when it is next used; one whose
        records still wait in the spool is kept until they are written.
        """
        self._recent[execution_id] = None
        self._recent.move_to_end(execution_id)
        for _ in range(len(self._recent) - self.max_executions):
            oldest = next(iter(self._recent))
            if self.spool.pending_for(oldest):
                self._recent.move_to_end(oldest)
                continue
            del self._recent[oldest]
            self._seqs.pop(oldest, None)
            self.ingestor.recorder.forget(oldest)

    def _remember(self, execution_id: str, request_id: str, full: npt.NDArray[np.int32]) -> None:
        seqs = self._seqs.setdefault(execution_id, _Sequences()).by_request
        seqs[request_id] = full
        while len(seqs) > self.keep_sequences:
            seqs.popitem(last=False)

    def _prefix_tokens(self, execution_id: str, request_id: str) -> npt.NDArray[np.int32]:
        seqs = self._seqs.setdefault(execution_id, _Sequences()).by_request
        if request_id not in seqs:
            # Not among the recent ones (or the proxy restarted): rebuild from the log.
            self.spool.flush()
            full: dict[str, npt.NDArray[np.int32]] = {}
            recorder: TrajectoryRecorder = self.ingestor.recorder
            for ev in recorder.log.read_stream(StreamId("calls", execution_id)):
                e = ev.event
                assert isinstance(e, ModelCallRecorded)
                a = TitoArrays.from_payload(ev.payload)
                prefix = full[e.prefix_of][: e.prefix_len] if e.prefix_of else np.zeros(0, np.int32)
                full[e.request_id] = np.concatenate([prefix, a.input_ids, a.output_ids])
            if request_id not in full:
                raise EngineBadRequest(f"record {request_id} of {execution_id} is not stored")
            seqs[request_id] = full[request_id]
        seqs.move_to_end(request_id)
        return seqs[request_id]

    async def _prepare(
        self, execution: ExecutionAuth, request: ChatRequest
    ) -> tuple[Prepared, npt.NDArray[np.int32]]:
        """The request matched and encoded, and the engine's full input.

        The common call (an execution's next turn, adding a tool result or a short prompt)
        is done on the event loop: handing it to a worker thread and back costs more than
        the work. A request with much new text to tokenize (over ``inline_chars``), or one
        that needs the log (an execution or a stored sequence not in memory), goes to a
        thread so the loop keeps streaming other answers.
        """
        ex, run = execution.execution_id, execution.run_id
        match = self.ingestor.match(ex, request)
        if match is not None and match.pending_chars <= self.inline_chars:
            point = match.exact or match.prefix
            seqs = self._seqs.get(ex)
            if point is None or (seqs is not None and point.request_id in seqs.by_request):
                self.prepared_inline += 1
                return self._prepare_now(ex, run, request, match)
        return await asyncio.to_thread(self._prepare_now, ex, run, request, match)

    def _prepare_now(
        self, execution_id: str, run_id: str, request: ChatRequest, match: Match | None
    ) -> tuple[Prepared, npt.NDArray[np.int32]]:
        prepared = self.ingestor.prepare(execution_id, run_id, request, match)
        return prepared, self._input_ids(prepared)

    def _input_ids(self, prepared: Prepared) -> npt.NDArray[np.int32]:
        enc = prepared.encoded
        if enc.prefix is None:
            return enc.new_ids
        prefix = self._prefix_tokens(prepared.execution_id, enc.prefix.request_id)[: enc.prefix_len]
        return np.concatenate([prefix, enc.new_ids])

    # -- the Answerer protocol --------------------------------------------------------------
    async def count_tokens(self, execution: ExecutionAuth, request: ChatRequest) -> int:
        prepared = await asyncio.to_thread(
            self.ingestor.prepare, execution.execution_id, execution.run_id, request
        )
        return prepared.encoded.input_len

    async def complete(self, execution: ExecutionAuth, request: ChatRequest) -> ChatResponse:
        done: MessageDone | None = None
        blocks: list[tuple[Block, ...]] = []
        async for ev in self._answer(execution, request, blocks):
            if isinstance(ev, MessageDone):
                done = ev
        assert done is not None and blocks, "an answer ends with MessageDone"
        return ChatResponse(
            blocks=blocks[0],
            stop_reason=done.stop_reason,
            input_tokens=done.input_tokens,
            output_tokens=done.output_tokens,
            stop_sequence=done.stop_sequence,
        )

    def stream(self, execution: ExecutionAuth, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        return self._answer(execution, request, [])

    async def _answer(
        self, execution: ExecutionAuth, request: ChatRequest, blocks_out: list[tuple[Block, ...]]
    ) -> AsyncIterator[StreamEvent]:
        ex = execution.execution_id
        self._touch(ex)
        prepared, input_ids = await self._prepare(execution, request)
        n_in = int(input_ids.shape[0])
        if n_in + 1 > self.context_limit:
            raise ContextTooLong(input_tokens=n_in, limit=self.context_limit)
        yield MessageStart(n_in)

        parser = OutputParser(thinking_open=False)
        started = time.time()
        first_token_s = 0.0
        request_id = f"req-{uuid.uuid4().hex[:16]}"
        attempt_prepared = prepared
        retry_of: str | None = None
        out_ids: list[int] = []  # every token the harness has received, across attempts
        out_lp: list[float] = []
        attempt_start = 0  # index into out_ids where the current attempt began
        versions: list[tuple[int, int]] = []
        decoded = IncrementalText(self.tok, skip=self._stop_ids)  # the output's visible text
        sent = 0  # characters of it fed to the parser (the harness has them)
        stop_hit: str | None = None
        hold = max((len(s) for s in request.stop), default=1) - 1
        finish = FinishKind.STOP
        engine_name = ""
        completed = False
        current: tuple[RoutedEngine, str] | None = None
        try:
            for attempt in range(MAX_ATTEMPTS):
                try:
                    routed = self.router.engine_for(ex)
                except EngineUnavailable as exc:
                    raise Overloaded("no engine is accepting requests; retry later") from exc
                engine_name = routed.name
                remaining = request.max_tokens - len(out_ids)
                sampling = SamplingConfig(
                    max_new_tokens=max(1, remaining),
                    temperature=request.temperature,
                    top_p=request.top_p,
                    stop_token_ids=self._stop_ids,
                )
                rid = f"{request_id}-a{attempt}"
                current = (routed, rid)
                context = (
                    np.concatenate([input_ids, np.asarray(out_ids, dtype=np.int32)]) if out_ids else input_ids
                )
                interrupted = False
                try:
                    async for delta in routed.engine.generate_stream(context.tolist(), sampling, rid=rid):
                        if delta.weight_version is not None and (
                            not versions or versions[-1][1] != _version(delta.weight_version)
                        ):
                            versions.append((len(out_ids), _version(delta.weight_version)))
                        if delta.output_ids.shape[0]:
                            if not first_token_s:
                                first_token_s = time.time() - started
                            new_ids = delta.output_ids.tolist()
                            out_ids.extend(new_ids)
                            out_lp.extend(delta.logprobs.tolist())
                            # Only the new tokens are decoded: re-decoding the whole output on
                            # every chunk made a long answer quadratic.
                            text = decoded.add(new_ids)
                            if len(text) > sent and not text.endswith("\ufffd"):
                                hit = _find_stop(text, request.stop, sent)
                                # Hold back what could be the start of a stop sequence, so the
                                # harness never receives part of one.
                                cut = hit[1] if hit is not None else max(sent, len(text) - hold)
                                if hit is not None:
                                    stop_hit = hit[0]
                                for ev in parser.feed(text[sent:cut]):
                                    yield ev
                                sent = cut
                                if stop_hit is not None:
                                    await routed.engine.abort(rid)
                                    break
                        if delta.finish is not None:
                            if delta.finish.kind == FinishKind.ABORT:
                                interrupted = True  # aborted by the engine: a role transition
                            else:
                                finish = delta.finish.kind
                except EngineBadRequest as exc:
                    if isinstance(exc, ContextLengthExceeded):
                        raise ContextTooLong(input_tokens=n_in, limit=self.context_limit) from exc
                    raise
                except EngineError:
                    # Unavailable, not accepting, broken stream: continue on another engine.
                    interrupted = True
                if stop_hit is not None or not interrupted:
                    completed = True
                    break
                # Record what this attempt produced (the harness has it) and continue elsewhere.
                self.rerouted += 1
                attempt_id = rid
                self._stage(
                    attempt_prepared, attempt_id, input_ids, out_ids, out_lp, attempt_start, None,
                    CallFinish.ABORT, delivered=True, engine=routed.name, versions=versions, retry_of=retry_of,
                    started=started, first_token_s=first_token_s,
                )  # fmt: skip
                self.router.mark_failed(routed.name, ex)
                attempt_prepared = continuation(prepared, attempt_id, len(out_ids))
                retry_of = attempt_id
                attempt_start = len(out_ids)
            if not completed:
                raise Overloaded("no engine could finish this request; retry later")
            if stop_hit is None:
                held = decoded.finish()[sent:]
                if held:
                    for ev in parser.feed(held):
                        yield ev
            events = parser.finish(
                finish, input_tokens=n_in, output_tokens=len(out_ids), stop_sequence=stop_hit
            )
            blocks_out.append(parser.blocks)
            assistant = Message(Role.ASSISTANT, parser.blocks)
            self._stage(
                attempt_prepared, request_id, input_ids, out_ids, out_lp, attempt_start, assistant,
                CallFinish.LENGTH if finish == FinishKind.LENGTH else CallFinish.STOP, delivered=True,
                engine=engine_name, versions=versions, retry_of=retry_of, started=started, first_token_s=first_token_s,
            )  # fmt: skip
            for ev in events:
                yield ev
        except (GeneratorExit, asyncio.CancelledError):
            # The harness went away mid-answer: stop the engine and keep what was sampled.
            if not completed:
                if current is not None:
                    await _quiet_abort(*current)
                self._stage(
                    attempt_prepared, f"{request_id}-cut", input_ids, out_ids, out_lp, attempt_start, None,
                    CallFinish.ABORT, delivered=False, engine=engine_name, versions=versions, retry_of=retry_of,
                    started=started, first_token_s=first_token_s,
                )  # fmt: skip
            raise

    def _stage(
        self,
        prepared: Prepared,
        request_id: str,
        input_ids: npt.NDArray[np.int32],
        out_ids: list[int],
        out_lp: list[float],
        start: int,
        assistant: Message | None,
        finish: CallFinish,
        *,
        delivered: bool,
        engine: str,
        versions: list[tuple[int, int]],
        retry_of: str | None,
        started: float,
        first_token_s: float,
    ) -> None:
        """Stage the record of the attempt that produced ``out_ids[start:]`` and spool it.

        Weight-version spans are per record: offsets count from this attempt's first token,
        and the version in force when it began comes first.
        """
        spans = [(0, v) for o, v in versions if o <= start][-1:] + [
            (o - start, v) for o, v in versions if o > start
        ]
        record = self.ingestor.stage(
            prepared,
            request_id=request_id,
            output_ids=np.asarray(out_ids[start:], dtype=np.int32),
            output_logprobs=np.asarray(out_lp[start:], dtype=np.float32),
            assistant=assistant,
            finish=finish,
            delivered=delivered,
            engine=engine,
            weight_versions=tuple(spans),
            retry_of=retry_of,
            started_at=started,
            first_token_s=first_token_s,
            duration_s=time.time() - started,
        )
        # The attempt's full sequence is the input and every token up to its end: no lookup.
        self._remember(
            prepared.execution_id,
            request_id,
            np.concatenate([input_ids, np.asarray(out_ids, dtype=np.int32)]),
        )
        self.spool.submit(record)


def _version(v: str) -> int:
    try:
        return int(v)
    except ValueError:
        return 0


def _find_stop(text: str, stops: tuple[str, ...], since: int) -> tuple[str, int] | None:
    best: tuple[str, int] | None = None
    for s in stops:
        i = text.find(s, max(0, since - len(s)))
        if i >= 0 and (best is None or i < best[1]):
            best = (s, i)
    return best


async def _quiet_abort(routed: RoutedEngine, rid: str) -> None:
    try:
        await routed.engine.abort(rid)
    except Exception:  # best effort: the engine may be gone already
        return


__all__ = ["AnswerPipeline", "stop_reason_for"]
