"""The answer pipeline: a harness's model call in, the policy's answer out, a TITO record kept.

For each call: match and encode the request against the execution's tree (only new
messages are tokenized), route it to the execution's engine, stream the sampled tokens to
the harness, and stage the record for the spool. What to send, when to stop, reroute or
record is decided by an ``AnswerMachine`` (``answer/machine.py``); this module is its async
shell: engines, routing, the spool, the clock. When an engine stops accepting, fails or
aborts mid-answer, the same answer continues on another engine from the tokens the harness
already has, so the harness sees one uninterrupted response. When the scheduler moves an
execution to another engine (the router's ``on_moved``), its request in flight is cancelled
on the old engine, and so continues on the new one: its KV cache moves with it where both
engines can (pinned by the old one, read by the new one over Mooncake or carried over HTTP
before the retry, released once imported), and otherwise the new engine prefills its context
again; which path it took, and over which transport, is recorded (``request.moved``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

import msgspec
import numpy as np
import numpy.typing as npt

from gyre_proxy.answer.machine import AnswerMachine, GiveUp, Reroute, Stage, StopEngine
from gyre_proxy.answer.routing import RoutedEngine, Router
from gyre_proxy.answer.sequences import SequenceCache, StoredRecord, rebuild_sequence
from gyre_proxy.chat import (
    ENGINE_WAIT,
    Block,
    ChatRequest,
    ChatResponse,
    EngineWait,
    ExecutionAuth,
    MessageDone,
    MessageStart,
    StreamEvent,
)
from gyre_proxy.engines import EngineClient, GenerateDelta
from gyre_proxy.exceptions import (
    ContextLengthExceeded,
    ContextTooLong,
    EngineBadRequest,
    EngineError,
    EngineUnavailable,
    Overloaded,
    WeightVersionInvalid,
)
from gyre_proxy.ingest import Ingestor, Match, Prepared, RecordSpool
from gyre_store.catalog import ModelCallRecorded, MovePath, RequestMoved, TitoArrays
from gyre_store.log import EventMetadata, NewEvent, StreamId
from gyre_store.trees import TrajectoryRecorder

log = logging.getLogger(__name__)


class ExecutionSync(Protocol):
    """Coherence between proxy processes serving the same executions (``service/workers.py``)."""

    async def fresh(self, execution_id: str) -> bool:
        """False when another process recorded a call of the execution since this one last
        served it (once those records are in the log): the caches must be dropped."""
        ...

    def staged(self, execution_id: str) -> None:
        """This process staged a record of the execution."""
        ...

    def written(self, execution_id: str) -> None:
        """This process's spool wrote (or dropped) a record of the execution."""
        ...


class AnswerObserver(Protocol):
    """Told of every finished answer (``ProxyMetrics`` in ``service/metrics.py``)."""

    def answered(self, input_tokens: int, output_tokens: int, added_s: float) -> None:
        """An answer finished with the usage it reported; ``added_s``: its seconds in the
        pipeline (matching, encoding, routing, the answer machine, staging, moves between
        engines) that were not spent waiting on an engine's stream."""
        ...


class AnswerPipeline:
    """A :class:`~gyre_proxy.chat.answerer.Answerer` over engines, the store and a spool."""

    def __init__(
        self,
        ingestor: Ingestor,
        router: Router,
        spool: RecordSpool,
        *,
        context_limit: int = 131_072,
        max_tokens: int | None = None,
        keep_sequences: int = 8,
        sequence_bytes: int = 1 << 30,
        max_executions: int = 4096,
        inline_chars: int = 8192,
        sync: ExecutionSync | None = None,
        observer: AnswerObserver | None = None,
    ) -> None:
        self.ingestor = ingestor
        self.router = router
        self.spool = spool
        self.context_limit = context_limit
        self.max_tokens = max_tokens  # the cap on one call's output, whatever the request asks
        self.keep_sequences = keep_sequences
        self.max_executions = max_executions
        self.inline_chars = inline_chars
        self.sync = sync
        self.observer = observer
        self.prepared_inline = 0  # requests encoded on the event loop (the rest went to a thread)
        # Full sequences of recent records, so the next turn slices its prefix from memory:
        # ``keep_sequences`` per execution, ``sequence_bytes`` in all (sequences.py says why).
        self.sequences = SequenceCache(max_bytes=sequence_bytes, per_execution=keep_sequences)
        self._recent: OrderedDict[str, None] = OrderedDict()
        self.tok = ingestor.template.tok
        self._stop_ids = ingestor.template.stop_ids
        self.rerouted = 0
        self.moved = 0  # requests in flight cancelled because the scheduler moved their execution
        self.kv_migrated = 0  # of those, the ones whose KV cache went with them
        self.kv_migration = True  # try to move a moved request's KV cache (else re-prefill)
        self.abort_failures = 0  # aborts an engine refused or never answered: it may still be generating
        self._in_flight: dict[str, tuple[RoutedEngine, str, str]] = {}  # execution -> engine, rid, run
        self._moving: dict[str, asyncio.Future[None]] = {}  # execution -> its move, awaited before the retry
        self._loop: asyncio.AbstractEventLoop | None = None
        router.on_moved(self._execution_moved)

    # -- the scheduler moving executions ---------------------------------------------------------
    def _execution_moved(self, execution_id: str) -> None:
        """The router moved ``execution_id`` (called on the thread that applies routing)."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._cancel_moved, execution_id)

    def _cancel_moved(self, execution_id: str) -> None:
        """On the event loop: abort the execution's attempt in flight on its old engine; its
        answer then continues wherever the router now sends it."""
        active = self._in_flight.get(execution_id)
        moving = self._moving.get(execution_id)
        if active is None or (moving is not None and not moving.done()):
            return  # nothing in flight (its next request goes to the new engine), or moving already
        routed, rid, run_id = active
        self.moved += 1
        self._moving[execution_id] = asyncio.ensure_future(self._move(execution_id, run_id, routed, rid))

    async def _move(self, execution_id: str, run_id: str, source: RoutedEngine, rid: str) -> None:
        """Cancel ``rid`` on ``source``, moving its KV cache to the execution's new engine when
        both can (the retry waits for this), else aborting it for a re-prefill; record which."""
        path, kv_tokens, detail, target = MovePath.REPREFILL, 0, "", ""
        try:
            destination = self.router.engine_for(execution_id)  # the new route is in place already
            target = destination.name
        except EngineUnavailable as exc:
            destination, detail = None, str(exc)
        src, dst = source.engine, destination.engine if destination is not None else None
        if not self.kv_migration:
            detail = "KV migration is off"
        elif not (isinstance(src, EngineClient) and isinstance(dst, EngineClient)):
            detail = detail or "an engine without KV migration"
        else:
            try:
                await src.pin_and_abort(rid)  # aborts the request once its KV is pinned
            except EngineError as exc:
                detail = f"not pinned: {exc}"
            else:
                # Over Mooncake first: the destination reads the pinned payload from the source's
                # memory. Where either engine cannot (or the read fails), the payload goes through
                # this process over HTTP; the pin holds meanwhile. The detail names the transport.
                transport = "mooncake"
                try:
                    try:
                        imported = await dst.pull_kv(await src.expose_kv(rid))
                    except EngineError as exc:
                        transport = f"http (not over mooncake: {exc})"
                        imported = await dst.import_kv(await src.export_kv(rid))
                    kv_tokens, path, detail = imported.num_tokens, MovePath.KV_MIGRATION, transport
                    self.kv_migrated += 1
                except EngineError as exc:
                    detail = f"not imported over {transport}: {exc}"
                finally:  # the destination holds it now, or never will: the pin goes either way
                    with contextlib.suppress(EngineError):
                        await src.release_kv(rid)
        if path is MovePath.REPREFILL:
            await self._abort_quietly(source, rid)
        moved = RequestMoved(
            execution_id=execution_id, run_id=run_id, request_id=rid, source=source.name,
            destination=target, path=path, kv_tokens=kv_tokens, detail=detail[:500],
        )  # fmt: skip
        # Through the spool like the records: kept and retried while the store is down, and the
        # answer goes on meanwhile. The key makes a resent batch a no-op. The spool reports each
        # event it writes to the workers' table as written, keyed by the execution, so it is
        # counted as staged too, or another worker would stop waiting before a record is in.
        event = NewEvent(
            moved, idempotency_key=f"moved:{execution_id}:{rid}", metadata=EventMetadata(run_id=run_id)
        )
        if self.sync is not None:
            self.sync.staged(execution_id)
        self.spool.submit(event)

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
            self.sequences.forget(oldest)
            self.ingestor.recorder.forget(oldest)
            self.ingestor.payloads.forget(oldest)

    async def _reload(self, execution_id: str) -> None:
        """Drop the execution's caches (another process recorded calls of it); they are read
        back from the log when next used. This process's own records of it go first."""
        if self.spool.pending_for(execution_id):
            await asyncio.to_thread(self.spool.flush)
        self.sequences.forget(execution_id)
        self.ingestor.recorder.forget(execution_id)
        # Critiques it asked for through another process are marked as critiques here too.
        await asyncio.to_thread(self.ingestor.critiques.refresh, execution_id)

    def _remember(self, execution_id: str, request_id: str, full: npt.NDArray[np.int32]) -> None:
        self.sequences.put(execution_id, request_id, full)

    def _prefix_tokens(self, execution_id: str, request_id: str) -> npt.NDArray[np.int32]:
        held = self.sequences.get(execution_id, request_id)
        if held is not None:
            return held
        # Not among the recent ones (or the proxy restarted): rebuild from the log, holding
        # each record's new tokens once and assembling only this record's sequence.
        self.spool.flush()
        recorder: TrajectoryRecorder = self.ingestor.recorder
        stored: list[StoredRecord] = []
        for ev in recorder.log.read_stream(StreamId("calls", execution_id)):
            e = ev.event
            assert isinstance(e, ModelCallRecorded)
            a = TitoArrays.from_payload(ev.payload)
            new = np.concatenate([a.input_ids, a.output_ids])
            stored.append(StoredRecord(e.request_id, e.prefix_of, e.prefix_len, new))
        full = rebuild_sequence(stored, request_id)
        if full is None:
            raise EngineBadRequest(f"record {request_id} of {execution_id} is not stored")
        self.sequences.put(execution_id, request_id, full)
        return full

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
            if point is None or self.sequences.holds(ex, point.request_id):
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
        """The async shell around an ``AnswerMachine``: route each attempt, stream its deltas
        through the machine, and carry out the machine's effects (events to the harness,
        engine aborts, reroutes, records staged with their timings)."""
        ex = execution.execution_id
        began = time.perf_counter()
        self._loop = asyncio.get_running_loop()
        if self.sync is not None and not await self.sync.fresh(ex):
            await self._reload(ex)
        self._touch(ex)
        prepared, input_ids = await self._prepare(execution, request)
        n_in = int(input_ids.shape[0])
        if n_in + 1 > self.context_limit:
            raise ContextTooLong(input_tokens=n_in, limit=self.context_limit)
        yield MessageStart(n_in)
        if self.max_tokens is not None and request.max_tokens > self.max_tokens:
            # The answer then ends as any request's does at its limit (stop reason max_tokens).
            request = msgspec.structs.replace(request, max_tokens=self.max_tokens)

        machine = AnswerMachine(
            request,
            prepared,
            input_ids,
            request_id=f"req-{uuid.uuid4().hex[:16]}",
            tokenizer=self.tok,
            stop_ids=self._stop_ids,
            family=self.ingestor.template.family,
            thinking_open=self.ingestor.template.opens_thinking(request.thinking),
        )
        timing = _Timing(time.time(), request_wait=ENGINE_WAIT.get())
        routed: RoutedEngine | None = None
        try:
            while not machine.completed:
                move = self._moving.pop(ex, None)
                if move is not None:
                    await move  # its KV cache reaches the new engine before the retry
                try:
                    routed = self.router.engine_for(ex)
                except EngineUnavailable as exc:
                    raise Overloaded("no engine is accepting requests; retry later") from exc
                attempt = machine.start(routed.name)
                self._in_flight[ex] = (routed, attempt.rid, execution.run_id)
                # The proxy's added latency is its time in here less the waits on the engine's
                # stream: from asking for the stream (or its next delta) to getting it.
                waiting: float | None = time.perf_counter()
                try:
                    stream = routed.engine.generate_stream(
                        attempt.context.tolist(), attempt.sampling, rid=attempt.rid
                    )
                    async for delta in stream:
                        assert waiting is not None  # set at the end of every pass
                        timing.waited(time.perf_counter() - waiting)
                        waiting = None
                        timing.saw(delta)
                        try:
                            steps = machine.on_delta(delta)
                        except WeightVersionInvalid as exc:
                            # Refused by the machine, not by the stream: the engine is still
                            # generating this request for nobody.
                            log.warning("engine %s, request %s: %s", routed.name, attempt.rid, exc)
                            await self._abort_quietly(routed, attempt.rid)
                            raise
                        for step in steps:
                            if isinstance(step, StopEngine):
                                await routed.engine.abort(step.rid)
                            else:
                                yield step
                        if machine.stop_sequence is not None:
                            break
                        waiting = time.perf_counter()
                except EngineBadRequest as exc:
                    if isinstance(exc, ContextLengthExceeded):
                        raise ContextTooLong(input_tokens=n_in, limit=self.context_limit) from exc
                    raise
                except EngineError as exc:
                    # Unavailable, not accepting, broken stream, a delta refused: continue on
                    # another engine; the attempt's record says why.
                    machine.fail(f"{type(exc).__name__}: {exc}"[:500])
                finally:
                    if waiting is not None:  # the stream ended, or failed, while the proxy waited on it
                        timing.waited(time.perf_counter() - waiting)
                    self._in_flight.pop(ex, None)
                ending = machine.end_attempt()
                if machine.completed:
                    blocks_out.append(machine.blocks)
                for outcome in ending:
                    if isinstance(outcome, Stage):
                        self._stage(outcome, timing)
                    elif isinstance(outcome, Reroute):
                        self.rerouted += 1
                        self.router.mark_failed(outcome.engine, ex)
                    elif isinstance(outcome, GiveUp):
                        raise Overloaded("no engine could finish this request; retry later")
                    else:
                        if isinstance(outcome, MessageDone) and self.observer is not None:
                            added = time.perf_counter() - began - timing.engine_s
                            self.observer.answered(outcome.input_tokens, outcome.output_tokens, added)
                        yield outcome
        except (GeneratorExit, asyncio.CancelledError):
            # The harness went away mid-answer: stop the engine and keep what was sampled.
            for cleanup in machine.cut():
                if isinstance(cleanup, StopEngine):
                    await self._abort_quietly(routed, cleanup.rid)
                else:
                    self._stage(cleanup, timing)
            raise

    async def _abort_quietly(self, routed: RoutedEngine | None, rid: str) -> None:
        """Abort ``rid`` on ``routed``'s engine where nothing waits on the outcome; a failure is
        logged and counted (``abort_failures``): that engine may keep generating for nobody."""
        if routed is None:
            return
        try:
            await routed.engine.abort(rid)
        except Exception:  # the engine may be gone already; cancellation still propagates
            self.abort_failures += 1
            log.warning(
                "engine %s: abort of %s failed; it may still be generating", routed.name, rid, exc_info=True
            )

    def _stage(self, staged: Stage, timing: _Timing) -> None:
        """Stage the attempt's record with its timings, and spool it."""
        record = self.ingestor.stage(
            staged.prepared,
            request_id=staged.request_id,
            output_ids=staged.output_ids,
            output_logprobs=staged.output_logprobs,
            assistant=staged.assistant,
            finish=staged.finish,
            delivered=staged.delivered,
            engine=staged.engine,
            weight_versions=staged.weight_versions,
            retry_of=staged.retry_of,
            detail=staged.detail,
            started_at=timing.started,
            first_token_s=timing.first_token_s,
            duration_s=time.time() - timing.started,
        )
        # The attempt's full sequence is the input and every token up to its end: no lookup.
        self._remember(staged.prepared.execution_id, staged.request_id, staged.sequence)
        if self.sync is not None:  # counted before the harness can see the answer's end
            self.sync.staged(staged.prepared.execution_id)
        self.spool.submit(record)


@dataclass
class _Timing:
    """When the answer started and how long its first token took (0 until one arrives)."""

    started: float
    first_token_s: float = 0.0
    engine_s: float = 0.0  # waiting on the engines' streams (perf_counter seconds)
    request_wait: EngineWait | None = None  # the HTTP layer's count of the same waits

    def waited(self, seconds: float) -> None:
        self.engine_s += seconds
        if self.request_wait is not None:
            self.request_wait.seconds += seconds

    def saw(self, delta: GenerateDelta) -> None:
        if not self.first_token_s and delta.output_ids.shape[0]:
            self.first_token_s = time.time() - self.started
