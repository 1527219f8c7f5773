"""The reference engine's scheduler: one thread interleaving decode steps of all requests.

Every admitted request keeps its own KV cache; each pass of the loop advances every active
request by one token, so concurrent requests progress together and a new one starts on the
next pass. Work that must not overlap decoding (weight updates) runs as an exclusive job:
admission pauses, in-flight requests finish (or are aborted when the job asks), the job runs,
admission resumes -- the same ordering SGLang's model-update lock gives.

For KV migration (``kvstore.py``): a new request whose input ids begin like an imported cache
starts from a copy of it and prefills only the rest; ``pin_abort`` ends a request between two
passes, when its cache covers exactly its input and every token it produced, and pins that
cache for export instead of dropping it.

The transformer body runs per request (each has its own cache, so no padding), but the output
projection runs once per pass for all of them: for a tiny model over a large vocabulary (the
Qwen vocabulary is 248K words) that projection is most of the work, and reading its weight
once for the pass instead of once per request is what makes concurrent requests cheap. Models
whose logits are not plainly the projection of the body's last hidden state (a soft cap, a
scale) run the whole model per request instead. The projection of several rows at once can
differ from one row's in the last bits (up to about 1e-6 here), so with a fixed seed a
request's tokens may depend on which requests shared its passes, as with any batching engine.
"""

from __future__ import annotations

import collections
import contextlib
import inspect
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from gyre_proxy.engines.refengine.kvcache import KvEntry, cache_from_entry, cache_layout, entry_from_cache
from gyre_proxy.engines.refengine.kvstore import KvLimits, PinnedCaches, PrefixCache
from gyre_proxy.engines.refengine.model import LoadedModel
from gyre_proxy.engines.refengine.sampling import choose
from gyre_proxy.engines.types import Finish, FinishKind, SamplingConfig
from gyre_proxy.exceptions import CacheNotMigratable, KvRefused, PinNotFound, RequestRejected

T = TypeVar("T")
log = logging.getLogger(__name__)

ABORT_MESSAGE = "Abort by /abort_request"
ABORT_WAITING_MESSAGE = "Abort in waiting queue"
PIN_ABORT_MESSAGE = "Abort by /gyre/kv/pin_abort (KV cache pinned for migration)"


@dataclass(frozen=True)
class StepEvent:
    """What one decode step produced for one request; ``finish`` is set on its last event."""

    token: int | None
    logprob: float | None
    finish: Finish | None
    weight_version: str
    cached_tokens: int = 0  # prompt positions whose KV came from an imported cache


EventSink = Callable[[StepEvent], None]


@dataclass(frozen=True)
class LoopLoad:
    """What the decode loop holds at one moment (``DecodeLoop.load``)."""

    waiting: int  # submitted, not yet admitted to a pass
    running: int  # admitted: prefilling or decoding
    kv_tokens: int  # positions whose KV the running requests' caches hold


@dataclass
class _Request:
    rid: str
    input_ids: list[int]
    sampling: SamplingConfig
    sink: EventSink
    forced: tuple[int, ...] | None
    generator: torch.Generator
    cache: Any = None
    next_logits: torch.Tensor | None = None  # [vocab], logits for the next position
    produced: list[int] = field(default_factory=list)
    cached: int = 0  # input positions taken from an imported cache at prefill


@dataclass
class _Job:
    run: Callable[[], Any]
    future: Future[Any]
    abort_all: bool


class DecodeLoop:
    """Owns the model on its own thread; every other thread talks to it through methods."""

    def __init__(
        self,
        loaded: LoadedModel,
        *,
        context_length: int,
        weight_version: str,
        return_original_logprob: bool = False,
        torch_threads: int = 1,
        tokenizer_vocab_only: bool = False,
        pinned: PinnedCaches | None = None,
        prefixes: PrefixCache | None = None,
    ) -> None:
        self.loaded = loaded
        self.torch_threads = torch_threads
        self.context_length = context_length
        self.weight_version = weight_version
        self.return_original_logprob = return_original_logprob
        # A model's vocabulary is often padded past the tokenizer's ids and a padding id has no
        # text: with `tokenizer_vocab_only`, sampling (and the reported logprob) covers the
        # tokenizer's ids only; by default the whole vocabulary, as SGLang does.
        self._sample_vocab = (
            min(loaded.vocab_size, max(loaded.tokenizer.vocab_size, 1)) if tokenizer_vocab_only else None
        )
        self._split = split_output_projection(loaded.model)
        self._cache_keyword = cache_keyword(loaded.model)
        self.layout = cache_layout(loaded.model)  # None: this model's KV cannot migrate
        self.pinned = pinned if pinned is not None else PinnedCaches(KvLimits())
        self.prefixes = prefixes if prefixes is not None else PrefixCache(KvLimits())
        self._pins: dict[str, Future[KvEntry]] = {}
        self._cond = threading.Condition()
        self._waiting: collections.deque[_Request] = collections.deque()
        self._active: dict[str, _Request] = {}
        self._aborts: dict[str | None, str] = {}  # rid (None: all) -> message
        self._jobs: collections.deque[_Job] = collections.deque()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="gyre-decode-loop", daemon=True)
        self.generated_tokens = 0  # every token chosen for a request, since the loop was made

    # -- called from other threads ------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join()
        with self._cond:  # a pin asked for after the loop ended
            self._fail_pins("engine shutting down")

    @property
    def in_flight(self) -> int:
        with self._cond:
            return len(self._waiting) + len(self._active)

    def load(self) -> LoopLoad:
        """The requests waiting and decoding now, and the tokens the decoding ones hold KV for."""
        with self._cond:
            kv = sum(len(r.input_ids) + len(r.produced) for r in self._active.values() if r.cache is not None)
            return LoopLoad(waiting=len(self._waiting), running=len(self._active), kv_tokens=kv)

    def submit(
        self,
        rid: str,
        input_ids: list[int],
        sampling: SamplingConfig,
        sink: EventSink,
        *,
        forced: tuple[int, ...] | None = None,
        seed: int,
    ) -> None:
        """Queue a validated request; ``sink`` receives its events on the loop thread."""
        generator = torch.Generator().manual_seed(seed)
        request = _Request(rid, input_ids, sampling, sink, forced, generator)
        with self._cond:
            self._waiting.append(request)
            self._cond.notify_all()

    def abort(self, rid: str | None, message: str = ABORT_MESSAGE) -> None:
        """Finish ``rid`` (every request when None) with finish reason abort; unknown rids are ignored."""
        with self._cond:
            self._aborts[rid] = message
            self._cond.notify_all()

    def pin_abort(self, rid: str) -> Future[KvEntry]:
        """Abort the decoding request ``rid`` and pin its cache, between two passes.

        The future holds the pinned entry, or fails with ``PinNotFound`` (no decoding request
        ``rid``: unknown, finished, or still waiting, so it has no KV), ``KvStoreFull`` or
        ``CacheNotMigratable``; when it fails the request was not aborted.
        """
        future: Future[KvEntry] = Future()
        with self._cond:
            if self.layout is None:
                future.set_exception(CacheNotMigratable("this model's KV cache cannot be migrated"))
            elif rid in self._pins:
                future.set_exception(PinNotFound(f"request {rid!r} is already being pinned"))
            else:
                self._pins[rid] = future
                self._cond.notify_all()
        return future

    def run_exclusive(self, run: Callable[[], T], *, abort_all: bool = False) -> Future[T]:
        """Run ``run`` on the loop thread once no request is in flight; admission waits meanwhile."""
        future: Future[T] = Future()
        with self._cond:
            self._jobs.append(_Job(run, future, abort_all))
            self._cond.notify_all()
        return future

    # -- the loop thread ----------------------------------------------------------------------

    def _run(self) -> None:
        # One intra-op thread by default: for a tiny model, OpenMP teams cost more than they
        # save, and spinning workers starve the HTTP threads (about 10x slower on 2 cores).
        torch.set_num_threads(self.torch_threads)
        with torch.inference_mode():
            while True:
                with self._cond:
                    while not self._has_work():
                        self._cond.wait()
                    if self._stopping:
                        self._fail_pins("engine shutting down")
                        self._abort_everything("engine shutting down")
                        return
                    self._apply_pins()
                    self._apply_aborts()
                    job = self._jobs[0] if self._jobs else None
                    if job is not None and job.abort_all:
                        self._abort_everything("Abort for weight update")
                    if job is None:
                        while self._waiting:
                            request = self._waiting.popleft()
                            self._active[request.rid] = request
                    runnable = list(self._active.values())
                if job is not None and not runnable:
                    self._run_job(job)
                    continue
                try:
                    self._pass(runnable)
                except Exception as exc:  # a sink that raised: end the pass's requests, keep the loop
                    log.exception("decode pass failed")
                    with self._cond:
                        for request in runnable:
                            if request.rid in self._active:
                                with contextlib.suppress(Exception):  # _finish pops it first
                                    self._finish(
                                        request, Finish(FinishKind.ABORT, message=f"internal error: {exc}")
                                    )

    def _has_work(self) -> bool:
        return bool(
            self._stopping or self._waiting or self._active or self._jobs or self._aborts or self._pins
        )

    def _apply_pins(self) -> None:
        # Between passes every decoding request's cache covers its input and every token it
        # produced (each pass feeds the token it chose): pinned now, the cache gets no more
        # writes, which is what the destination needs before it reads it.
        for rid, future in self._pins.items():
            request = self._active.get(rid)
            try:
                if request is None or request.cache is None:
                    waiting = any(r.rid == rid for r in self._waiting)
                    state = "is still waiting (no KV yet)" if waiting else "is not decoding"
                    raise PinNotFound(f"request {rid!r} {state}: abort it plainly")
                assert self.layout is not None  # pin_abort refuses otherwise
                entry = entry_from_cache(
                    request.cache,
                    request.input_ids + request.produced,
                    rid=rid,
                    weight_version=self.weight_version,
                    layout=self.layout,
                )
                self.pinned.add(entry)
            except KvRefused as exc:
                future.set_exception(exc)
                continue
            self._finish(request, Finish(FinishKind.ABORT, message=PIN_ABORT_MESSAGE))
            future.set_result(entry)
        self._pins.clear()

    def _fail_pins(self, message: str) -> None:
        for future in self._pins.values():
            future.set_exception(RequestRejected(message, 503))
        self._pins.clear()

    def _apply_aborts(self) -> None:
        for rid, message in self._aborts.items():
            for request in [r for r in self._waiting if rid is None or r.rid == rid]:
                self._waiting.remove(request)
                self._finish(request, Finish(FinishKind.ABORT, message=ABORT_WAITING_MESSAGE))
            for request in [r for r in self._active.values() if rid is None or r.rid == rid]:
                self._finish(request, Finish(FinishKind.ABORT, message=message))
        self._aborts.clear()

    def _abort_everything(self, message: str) -> None:
        self._aborts[None] = message
        self._apply_aborts()

    def _run_job(self, job: _Job) -> None:
        with self._cond:
            self._jobs.popleft()
        try:
            job.future.set_result(job.run())
        except BaseException as exc:  # handed to the waiting caller, not swallowed
            job.future.set_exception(exc)

    def _finish(
        self, request: _Request, finish: Finish, token: int | None = None, logprob: float | None = None
    ) -> None:
        self._active.pop(request.rid, None)
        request.cache = None
        request.sink(StepEvent(token, logprob, finish, self.weight_version, request.cached))

    def _forward(self, requests: list[tuple[_Request, list[int]]]) -> None:
        """Feed each request its ``ids`` and set its ``next_logits``: the body per request, the
        output projection once for all (or the whole model per request, see the module doc)."""
        if not requests:
            return
        hidden: list[torch.Tensor] = []
        fed: list[_Request] = []
        # Ids go to the model's device; logits come back to the CPU, where sampling runs.
        device = next(self.loaded.model.parameters()).device
        for request, ids in requests:
            try:
                if request.cache is None:
                    request.cache, ids = self._new_cache(request, ids)
                if self._split is None:
                    # Only the last position's logits are needed: a long prompt over a large
                    # vocabulary would otherwise materialise prompt_len x vocab logits.
                    out = self.loaded.model(
                        input_ids=torch.tensor([ids], device=device),
                        use_cache=True,
                        logits_to_keep=1,
                        **{self._cache_keyword: request.cache},
                    )
                    request.next_logits = out.logits[0, -1].cpu()
                    continue
                body, _ = self._split
                out = body(
                    input_ids=torch.tensor([ids], device=device),
                    use_cache=True,
                    **{self._cache_keyword: request.cache},
                )
                hidden.append(out.last_hidden_state[0, -1])
                fed.append(request)
            except Exception as exc:  # one broken request must not stop the loop
                self._failed(request, exc)
        if not fed:
            return
        assert self._split is not None
        try:
            logits = self._split[1](torch.stack(hidden)).cpu()
        except Exception as exc:
            for request in fed:
                self._failed(request, exc)
            return
        for row, request in enumerate(fed):
            request.next_logits = logits[row]

    def _new_cache(self, request: _Request, ids: list[int]) -> tuple[Any, list[int]]:
        """A prefilling request's cache and the ids still to run: a copy of the imported entry
        sharing the longest prefix with ``ids`` (decided here, on the loop thread, so that no
        weight update falls between the match and the prefill), or an empty cache."""
        from transformers import DynamicCache

        config = self.loaded.model.config
        found = self.prefixes.match(ids, self.weight_version) if self.prefixes else None
        if found is None:
            return DynamicCache(config=config), ids  # type: ignore[arg-type]
        entry, shared = found
        request.cached = shared
        device = next(self.loaded.model.parameters()).device
        return cache_from_entry(entry, shared, config, device), ids[shared:]

    def _failed(self, request: _Request, exc: Exception) -> None:
        log.error("request %s failed", request.rid, exc_info=exc)
        with self._cond:
            if request.rid in self._active:
                self._finish(request, Finish(FinishKind.ABORT, message=f"internal error: {exc}"))

    def _pass(self, runnable: list[_Request]) -> None:
        """Advance every runnable request by one token: prefill the new ones, choose a token for
        each, then feed the chosen tokens of those that go on."""
        self._forward(
            [(r, r.input_ids) for r in runnable if r.next_logits is None and r.sampling.max_new_tokens > 0]
        )
        going_on: list[tuple[_Request, list[int]]] = []
        for request in runnable:
            try:
                token = self._choose(request)
            except Exception as exc:
                self._failed(request, exc)
                continue
            if token is not None:
                going_on.append((request, [token]))
        self._forward(going_on)

    def _choose(self, request: _Request) -> int | None:
        """Choose and emit the request's next token; the token when it goes on, else None."""
        sampling = request.sampling
        if sampling.max_new_tokens <= 0:
            with self._cond:
                if request.rid in self._active:
                    self._finish(request, Finish(FinishKind.LENGTH))
            return None
        if request.next_logits is None:
            return None  # its prefill failed and finished it
        position = len(request.produced)
        forced = request.forced[position] if request.forced is not None else None
        choice = choose(
            request.next_logits[: self._sample_vocab] if self._sample_vocab else request.next_logits,
            sampling,
            request.generator,
            return_original_logprob=self.return_original_logprob,
            forced=forced,
        )
        request.produced.append(choice.token)
        self.generated_tokens += 1  # only this thread writes it
        finish = self._finish_reason(request, choice.token)
        with self._cond:
            if request.rid not in self._active:
                return None  # finished earlier in this pass (its prefill failed)
            if finish is not None:
                self._finish(request, finish, choice.token, choice.logprob)
                return None
            request.sink(StepEvent(choice.token, choice.logprob, None, self.weight_version, request.cached))
        return choice.token

    def _finish_reason(self, request: _Request, token: int) -> Finish | None:
        sampling = request.sampling
        if token in sampling.stop_token_ids or (
            not sampling.ignore_eos and token in self.loaded.eos_token_ids
        ):
            return Finish(FinishKind.STOP, matched=token)
        produced = len(request.produced)
        if produced >= sampling.max_new_tokens:
            return Finish(FinishKind.LENGTH)
        if len(request.input_ids) + produced >= self.context_length:
            return Finish(FinishKind.LENGTH)
        if request.forced is not None and produced >= len(request.forced):
            # A scripted output ran out without a stop token: the script ends the turn.
            return Finish(FinishKind.STOP)
        return None


# Model types whose logits are exactly ``lm_head(model(...).last_hidden_state)``.
_PLAIN_HEAD_TYPES = frozenset({"qwen3", "qwen2", "llama", "mistral"})


def cache_keyword(model: torch.nn.Module) -> str:
    """The keyword a transformers model takes its KV cache by: ``cache`` since transformers
    renamed it, ``past_key_values`` before. An unknown keyword is swallowed by the model's
    ``**kwargs`` and the model then decodes each step without its cache (wrong logprobs, no
    error), so the name is read from the signature rather than assumed."""
    parameters = inspect.signature(model.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def split_output_projection(
    model: torch.nn.Module,
) -> tuple[Callable[..., Any], Callable[[torch.Tensor], torch.Tensor]] | None:
    """The model's body and output projection, when its logits are plainly the projection of
    the body's last hidden state; None otherwise (the whole model then runs per request)."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) not in _PLAIN_HEAD_TYPES:
        return None
    body = getattr(model, "model", None)
    head = getattr(model, "lm_head", None)
    if not isinstance(body, torch.nn.Module) or not isinstance(head, torch.nn.Linear):
        return None
    return body, head
