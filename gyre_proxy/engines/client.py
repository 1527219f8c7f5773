"""``EngineClient``: one engine reached over SGLang's native HTTP API.

The same client talks to a real SGLang server and to gyre's reference engine. With
``engine_http`` (which turns transport errors into ``EngineUnavailable``) it is the only place
where HTTP statuses exist; everything else sees the ``gyre_proxy.exceptions`` tree. It does not
retry, route or record: the proxy does that.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self, TypeVar

import httpx
import msgspec

from gyre_proxy.engines import wire as engine_api
from gyre_proxy.engines.stream import SseData, StreamAccumulator, result_from_response
from gyre_proxy.engines.transport import AiohttpEngineHttp, EngineHttp, HttpResponse, HttpxEngineHttp, drain
from gyre_proxy.engines.types import (
    EngineInfo,
    ExposedKv,
    GenerateDelta,
    GenerateResult,
    ImportedKv,
    KvPayload,
    PinnedKv,
    SamplingConfig,
    WeightUpdate,
)
from gyre_proxy.exceptions import (
    ContextLengthExceeded,
    EngineBadRequest,
    EngineError,
    EngineNotAccepting,
    EngineProtocolError,
    EngineRequestAborted,
    EngineServerError,
    EngineUnavailable,
    KvCacheFull,
    KvCacheIncompatible,
    KvCacheNotFound,
    KvMigrationError,
    KvMigrationUnsupported,
    KvTransferFailed,
    KvTransferUnsupported,
    WeightUpdateFailed,
)

T = TypeVar("T")

NOT_ACCEPTING_MESSAGE = engine_api.NOT_ACCEPTING_MESSAGE
_CONTEXT_MARKERS = ("context length", "maximum context length")
# How long to wait, after ``[DONE]``, for the end of a /generate body before giving up on
# reusing its connection (SGLang ends the body right after ``[DONE]``).
_DRAIN_TIMEOUT_S = 1.0


class PauseGenerationRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Body of ``POST /pause_generation`` (SGLang's ``PauseGenerationReqInput``).

    ``abort``: abort every request in flight and return once none is left; ``in_place``: stop
    decoding, requests keep their KV cache and go on after ``/continue_generation``;
    ``retract``: stop decoding and put running requests back in the queue, their KV freed and
    computed again (under the weights served by then) after ``/continue_generation``. While
    paused, new requests wait and a weight update runs at once, without waiting for requests
    in flight to finish.
    """

    mode: str = "abort"


class ContinueGenerationRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Body of ``POST /continue_generation``; ``torch_empty_cache`` returns the CUDA
    allocator's cached blocks before decoding resumes (SGLang; a no-op without CUDA)."""

    torch_empty_cache: bool = True


class SchedulerLoad(msgspec.Struct, frozen=True, kw_only=True):
    """One scheduler's entry in SGLang's ``GET /v1/loads`` (the fields gyre reads)."""

    num_running_reqs: int = 0
    num_waiting_reqs: int = 0


class EngineLoads(msgspec.Struct, frozen=True, kw_only=True):
    """Answer of SGLang's ``GET /v1/loads``."""

    loads: list[SchedulerLoad] = msgspec.field(default_factory=list)


@dataclass(frozen=True)
class EngineClientConfig:
    """Where the engine is and how long to wait for it."""

    base_url: str
    timeout_s: float = 600.0
    connect_timeout_s: float = 5.0
    # Concurrent (and kept-alive) connections. Each streamed generation holds one.
    max_connections: int = 1024
    # Idle connections are dropped before the engine drops them: SGLang's uvicorn closes an
    # idle one after 5 s, and a request sent on a connection being closed would fail.
    keepalive_s: float = 4.0


def error_message(response: HttpResponse) -> str:
    """The human message in an error body (SGLang uses several envelopes)."""
    try:
        body: Any = msgspec.json.decode(response.content)
    except msgspec.DecodeError:
        return response.content.decode(errors="replace").strip() or f"HTTP {response.status}"
    if isinstance(body, dict):
        inner = body.get("error")
        if isinstance(inner, dict) and "message" in inner:
            return str(inner["message"])
        for key in ("message", "detail", "error"):
            if key in body:
                return str(body[key])
    return str(body)


_KV_ERRORS: dict[str, type[KvMigrationError]] = {
    engine_api.KV_NOT_FOUND: KvCacheNotFound,
    engine_api.KV_CACHE_FULL: KvCacheFull,
    engine_api.KV_INCOMPATIBLE: KvCacheIncompatible,
    engine_api.KV_UNSUPPORTED: KvMigrationUnsupported,
    engine_api.KV_TRANSFER_UNSUPPORTED: KvTransferUnsupported,
    engine_api.KV_TRANSFER_FAILED: KvTransferFailed,
}


def kv_error_for(
    response: HttpResponse, missing: type[KvMigrationError] = KvMigrationUnsupported
) -> EngineError:
    """The typed error of a refused ``/gyre/kv/...`` call: by the body's ``code``, else a 404
    without one is an engine without this endpoint (``missing``: SGLang has none of them, and
    an engine from before the Mooncake path lacks only those), else as ``error_for``."""
    try:
        body = engine_api.decode(response.content, engine_api.KvErrorResponse)
    except (msgspec.DecodeError, msgspec.ValidationError):
        body = None
    if body is not None and body.error.code in _KV_ERRORS:
        return _KV_ERRORS[body.error.code](body.error.message)
    message = error_message(response)
    if response.status in (404, 405):
        return missing(f"the engine has no KV-migration endpoint: {message}")
    return error_for(response.status, message)


def error_for(status: int, message: str) -> EngineError:
    """The typed error for an HTTP status and its message."""
    if status == 400:
        if any(marker in message for marker in _CONTEXT_MARKERS):
            return ContextLengthExceeded(message)
        return EngineBadRequest(message)
    if status == 503:
        if NOT_ACCEPTING_MESSAGE in message:
            return EngineNotAccepting(message)
        return EngineUnavailable(message)
    if status == 404:
        return EngineProtocolError(f"endpoint not found: {message}")
    if status >= 500:
        return EngineServerError(f"HTTP {status}: {message}")
    return EngineBadRequest(f"HTTP {status}: {message}")


class EngineClient:
    """An async client for one engine base URL; use as ``async with EngineClient(cfg) as c``.

    It speaks HTTP through aiohttp; ``transport`` plugs in any httpx transport instead
    (``httpx.ASGITransport`` for an in-process app, ``httpx.MockTransport`` in tests).
    """

    def __init__(
        self, config: EngineClientConfig, *, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self.config = config
        self._http: EngineHttp
        if transport is not None:
            self._http = HttpxEngineHttp(
                config.base_url,
                timeout_s=config.timeout_s,
                connect_timeout_s=config.connect_timeout_s,
                transport=transport,
            )
        else:
            self._http = AiohttpEngineHttp(
                config.base_url,
                timeout_s=config.timeout_s,
                connect_timeout_s=config.connect_timeout_s,
                max_connections=config.max_connections,
                keepalive_s=config.keepalive_s,
            )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # -- transport ---------------------------------------------------------------------------

    async def _request(self, method: str, path: str, body: msgspec.Struct | None = None) -> HttpResponse:
        content = engine_api.encode(body) if body is not None else None
        return await self._http.request(method, path, content)

    async def _call(self, method: str, path: str, body: msgspec.Struct | None, kind: type[T]) -> T:
        response = await self._request(method, path, body)
        if response.status != 200:
            raise error_for(response.status, error_message(response))
        return _decode(response.content, kind, path)

    # -- generation --------------------------------------------------------------------------

    @staticmethod
    def _generate_body(
        input_ids: Sequence[int], sampling: SamplingConfig, rid: str, *, stream: bool
    ) -> engine_api.GenerateRequest:
        return engine_api.GenerateRequest(
            input_ids=engine_api.token_list(input_ids),
            sampling_params=sampling.to_wire(),
            rid=rid,
            return_logprob=True,
            # Only output logprobs are wanted; starting past the prompt skips input logprobs.
            logprob_start_len=max(len(input_ids) - 1, 0),
            stream=stream,
        )

    async def generate(
        self, input_ids: Sequence[int], sampling: SamplingConfig, *, rid: str | None = None
    ) -> GenerateResult:
        """Generate to completion; an aborted request returns with finish ABORT.

        Raises ``ContextLengthExceeded``/``EngineBadRequest`` for a rejected request,
        ``EngineNotAccepting`` when the engine is draining, ``EngineUnavailable`` when
        unreachable, ``EngineRequestAborted`` when the engine aborted it with an error.
        """
        rid = rid or uuid.uuid4().hex
        body = self._generate_body(input_ids, sampling, rid, stream=False)
        response = await self._request("POST", "/generate", body)
        if response.status != 200:
            error = error_for(response.status, error_message(response))
            if response.status == 500:  # SGLang's scheduler aborted it mid-flight
                raise EngineRequestAborted(str(error)) from error
            raise error
        wire = _decode(response.content, engine_api.GenerateResponse, "/generate")
        return result_from_response(wire, rid)

    async def generate_stream(
        self, input_ids: Sequence[int], sampling: SamplingConfig, *, rid: str | None = None
    ) -> AsyncIterator[GenerateDelta]:
        """Yield increments as the engine produces them; the last carries ``finish``.

        Works with SGLang's cumulative chunks (the default) and incremental ones. Closing the
        iterator early closes the connection, which makes SGLang abort the request; a stream
        read to its end leaves its connection to the next request.
        """
        rid = rid or uuid.uuid4().hex
        body = engine_api.encode(self._generate_body(input_ids, sampling, rid, stream=True))
        async with self._http.stream("POST", "/generate", body) as response:
            if response.status != 200:
                content = await response.read()
                raise error_for(response.status, error_message(HttpResponse(response.status, content)))
            accumulator = StreamAccumulator(rid)
            chunks = response.chunks()
            sse = SseData()
            try:
                # The body's lines are cut here, not by a generator of their own: one
                # resumption fewer per streamed token. ``chunks`` is left just past [DONE].
                async for chunk in chunks:
                    for data in sse.feed(chunk):
                        delta = accumulator.feed(data)
                        if delta is not None:
                            yield delta
                    if sse.done:
                        break
                else:
                    for data in sse.end():
                        delta = accumulator.feed(data)
                        if delta is not None:
                            yield delta
            except EngineUnavailable as exc:
                raise EngineUnavailable(f"stream of {rid} broke: {exc}") from exc
            if not accumulator.finished:
                raise EngineRequestAborted(f"stream of {rid} ended without a finish reason")
            # Past [DONE] only the end of the chunked body is left; reading it lets the pool
            # reuse the connection (a new one per request cost about 1 ms of proxy CPU).
            await drain(chunks, _DRAIN_TIMEOUT_S)

    async def abort(self, rid: str) -> None:
        """Ask the engine to abort ``rid``; unknown or finished rids are not an error."""
        await self._call("POST", "/abort_request", engine_api.AbortRequest(rid=rid), bytes)

    async def abort_all(self) -> None:
        await self._call("POST", "/abort_request", engine_api.AbortRequest(abort_all=True), bytes)

    # -- state -------------------------------------------------------------------------------

    async def health(self) -> bool:
        """True when ``/health`` answers 200; False on any other status or no answer."""
        try:
            response = await self._request("GET", "/health")
        except EngineUnavailable:
            return False
        return response.status == 200

    async def model_info(self) -> EngineInfo:
        response = await self._request("GET", "/model_info")
        if response.status == 404:  # SGLang before the rename
            response = await self._request("GET", "/get_model_info")
        if response.status != 200:
            raise error_for(response.status, error_message(response))
        wire = _decode(response.content, engine_api.ModelInfo, "/model_info")
        return EngineInfo(wire.model_path, wire.weight_version, wire.context_length)

    async def weight_version(self) -> str:
        answer = await self._call("GET", "/get_weight_version", None, engine_api.WeightVersionResponse)
        return answer.weight_version

    async def flush_cache(self) -> None:
        await self._call("POST", "/flush_cache", None, bytes)

    async def requests_in_flight(self) -> int:
        """Requests the engine is running or has queued: SGLang's ``/v1/loads`` (running plus
        waiting, summed over its schedulers), else the reference engine's ``/gyre/status``."""
        response = await self._request("GET", "/v1/loads?include=core")
        if response.status == 404:
            return (await self.admission_status()).in_flight
        if response.status != 200:
            raise error_for(response.status, error_message(response))
        answer = _decode(response.content, EngineLoads, "/v1/loads")
        return sum(load.num_running_reqs + load.num_waiting_reqs for load in answer.loads)

    # -- pausing generation ------------------------------------------------------------------

    async def pause_generation(self, mode: str = "retract") -> None:
        """Pause generation (``PauseGenerationRequest`` says what each mode does) until
        ``continue_generation``. Raises ``EngineProtocolError`` when the engine has no such
        endpoint (SGLang before pausing existed), ``EngineBadRequest`` when it refuses ``mode``."""
        await self._call("POST", "/pause_generation", PauseGenerationRequest(mode=mode), bytes)

    async def continue_generation(self, *, torch_empty_cache: bool = True) -> None:
        """Resume what ``pause_generation`` paused; requests that waited start."""
        body = ContinueGenerationRequest(torch_empty_cache=torch_empty_cache)
        await self._call("POST", "/continue_generation", body, bytes)

    # -- weights -----------------------------------------------------------------------------

    async def _weight_call(self, path: str, body: msgspec.Struct | None) -> engine_api.WeightUpdateResponse:
        response = await self._request("POST", path, body)
        try:
            answer = engine_api.decode(response.content, engine_api.WeightUpdateResponse)
        except (msgspec.DecodeError, msgspec.ValidationError):
            if response.status != 200:
                raise error_for(response.status, error_message(response)) from None
            raise EngineProtocolError(f"{path} answered {response.content[:200]!r}") from None
        if not answer.success:
            raise WeightUpdateFailed(f"{path}: {answer.message}")
        return answer

    async def update_weights_from_disk(
        self, model_path: str, *, weight_version: str, abort_all_requests: bool = False
    ) -> WeightUpdate:
        """Load weights saved under ``model_path`` (the engine's filesystem)."""
        body = engine_api.UpdateWeightsFromDiskRequest(
            model_path=model_path, weight_version=weight_version, abort_all_requests=abort_all_requests
        )
        answer = await self._weight_call("/update_weights_from_disk", body)
        return WeightUpdate(answer.message, weight_version)

    async def tensor_load_formats(self) -> tuple[str, ...] | None:
        """The ``load_format`` values the engine's ``/update_weights_from_tensor`` accepts.

        gyre's reference engine lists them in ``/model_info``; ``None`` means a real SGLang
        server, which takes its own pickled payload (``engine_weights.sglang_tensor_payload``).
        """
        response = await self._request("GET", "/model_info")
        if response.status != 200:
            raise error_for(response.status, error_message(response))
        wire = _decode(response.content, engine_api.ModelInfo, "/model_info")
        return tuple(wire.tensor_load_formats) if wire.tensor_load_formats is not None else None

    async def begin_weight_update(self) -> None:
        """Open the engine's weight-update session; ``WeightUpdateFailed`` if one is open."""
        await self._weight_call("/begin_weight_update", engine_api.EmptyRequest())

    async def end_weight_update(self) -> None:
        """Close the session; ``WeightUpdateFailed`` if none is open."""
        await self._weight_call("/end_weight_update", engine_api.EmptyRequest())

    async def _in_session(self, path: str, body: msgspec.Struct) -> engine_api.WeightUpdateResponse:
        # SGLang 0.5.23 takes tensor and distributed updates only inside a session. A failed
        # update still closes it, and the update's error is the one that surfaces.
        await self.begin_weight_update()
        try:
            answer = await self._weight_call(path, body)
        except BaseException:
            with contextlib.suppress(EngineError):
                await self.end_weight_update()
            raise
        await self.end_weight_update()
        return answer

    async def update_weights_from_tensor(
        self, serialized: Sequence[str], *, weight_version: str, load_format: str | None = None
    ) -> WeightUpdate:
        """Send tensors serialized by ``engine_weights`` (one payload per TP rank) in a session.

        ``load_format`` is ``None`` for SGLang's own payload and ``"gyre_safetensors"`` for the
        reference engine. Raises ``WeightUpdateFailed`` when the engine refuses the update.
        """
        body = engine_api.UpdateWeightsFromTensorRequest(
            serialized_named_tensors=list(serialized), load_format=load_format, weight_version=weight_version
        )
        answer = await self._in_session("/update_weights_from_tensor", body)
        return WeightUpdate(answer.message, weight_version)

    async def init_weights_update_group(self, body: engine_api.InitWeightsUpdateGroupRequest) -> None:
        """Make the engine join the group; blocks until every rank has joined (start rank 0 first)."""
        await self._weight_call("/init_weights_update_group", body)

    async def destroy_weights_update_group(self, group_name: str) -> None:
        """Leave and drop ``group_name``; ``WeightUpdateFailed`` if the engine has no such group."""
        body = engine_api.DestroyWeightsUpdateGroupRequest(group_name=group_name)
        await self._weight_call("/destroy_weights_update_group", body)

    async def update_weights_from_distributed(
        self, body: engine_api.UpdateWeightsFromDistributedRequest
    ) -> WeightUpdate:
        """Receive ``body``'s tensors by broadcast from rank 0, in a session.

        Rank 0 must broadcast them concurrently, in ``body.names`` order (``WeightUpdateGroup``).
        """
        answer = await self._in_session("/update_weights_from_distributed", body)
        return WeightUpdate(answer.message, body.weight_version)

    async def update_weight_version(self, new_version: str) -> None:
        body = engine_api.UpdateWeightVersionRequest(new_version=new_version)
        await self._call("POST", "/update_weight_version", body, bytes)

    async def release_memory_occupation(self, tags: Sequence[str] | None = None) -> None:
        body = engine_api.MemoryOccupationRequest(tags=list(tags) if tags else None)
        await self._call("POST", "/release_memory_occupation", body, bytes)

    async def resume_memory_occupation(self, tags: Sequence[str] | None = None) -> None:
        body = engine_api.MemoryOccupationRequest(tags=list(tags) if tags else None)
        await self._call("POST", "/resume_memory_occupation", body, bytes)

    # -- KV migration (reference engine only) ------------------------------------------------
    #
    # A reroute that keeps its KV: ``pin_and_export`` on the source (instead of ``abort``; the
    # request's stream ends with finish ABORT as after an abort), ``import_kv`` on the
    # destination, then the retry's ``generate`` there reuses the imported prefix, and
    # ``release_kv`` on the source once the destination has taken over. Over Mooncake the
    # payload skips this process: ``expose_kv`` on the source, ``pull_kv`` on the destination
    # (it reads the source's memory), then ``release_kv``. Every refusal is a
    # ``KvMigrationError``: a ``KvTransferUnsupported`` or ``KvTransferFailed`` of the Mooncake
    # calls leaves the pin in place for the HTTP calls; otherwise abort plainly (if the request
    # was not aborted) and re-prefill.

    async def _kv_call(
        self,
        path: str,
        content: bytes,
        kind: type[T],
        missing: type[KvMigrationError] = KvMigrationUnsupported,
    ) -> T:
        response = await self._http.request("POST", path, content)
        if response.status != 200:
            raise kv_error_for(response, missing)
        return _decode(response.content, kind, path)

    async def pin_and_abort(self, rid: str) -> PinnedKv:
        """Abort the decoding request ``rid`` and pin its KV on the engine under ``rid``.

        Raises ``KvCacheNotFound`` (``rid`` is not decoding: finished, unknown, or waiting with
        no KV yet), ``KvCacheFull`` (the pin bound), ``KvMigrationUnsupported``; after any of
        them the request was **not** aborted.
        """
        body = engine_api.encode(engine_api.KvRidRequest(rid=rid))
        answer = await self._kv_call("/gyre/kv/pin_abort", body, engine_api.KvPinned)
        return PinnedKv(answer.rid, answer.num_tokens, answer.nbytes, answer.weight_version)

    async def export_kv(self, rid: str) -> KvPayload:
        """The pinned KV of ``rid`` as a payload (it stays pinned); ``KvCacheNotFound`` if none."""
        body = engine_api.encode(engine_api.KvRidRequest(rid=rid))
        content = await self._kv_call("/gyre/kv/export", body, bytes)
        try:
            return KvPayload.from_bytes(content)
        except ValueError as exc:
            raise EngineProtocolError(f"/gyre/kv/export answered a bad payload: {exc}") from exc

    async def pin_and_export(self, rid: str) -> KvPayload:
        """``pin_and_abort`` then ``export_kv``: the source's one call of a migration. If the
        export fails the cache stays pinned; ``release_kv(rid)`` frees it."""
        await self.pin_and_abort(rid)
        return await self.export_kv(rid)

    async def import_kv(self, payload: KvPayload | bytes) -> ImportedKv:
        """Keep ``payload`` as a prefix-cache entry; a later generate whose input ids begin with
        its token ids prefills only the rest (``meta_info.cached_tokens`` says how many came
        from it). Raises ``KvCacheIncompatible`` (another model's layout or weight version, or
        malformed), ``KvCacheFull`` (larger than the import bound)."""
        data = payload.data if isinstance(payload, KvPayload) else payload
        # The transport labels bodies as JSON; the engine reads this one as the binary payload.
        answer = await self._kv_call("/gyre/kv/import", data, engine_api.KvImported)
        return ImportedKv(answer.key, answer.num_tokens, answer.nbytes)

    async def expose_kv(self, rid: str) -> ExposedKv:
        """Register the pinned KV payload of ``rid`` with the engine's Mooncake Transfer Engine,
        for a destination to read with ``pull_kv``, until ``release_kv``.

        Raises ``KvTransferUnsupported`` (the engine has no Mooncake, or no such endpoint: use
        ``export_kv``), ``KvCacheNotFound`` (nothing pinned under ``rid``), ``KvTransferFailed``.
        """
        body = engine_api.encode(engine_api.KvRidRequest(rid=rid))
        answer = await self._kv_call(
            "/gyre/kv/expose", body, engine_api.KvTransferDescriptor, KvTransferUnsupported
        )
        return ExposedKv.from_wire(answer)

    async def pin_and_expose(self, rid: str) -> ExposedKv:
        """``pin_and_abort`` then ``expose_kv``. If the expose fails the cache stays pinned: move
        it with ``export_kv``, or free it with ``release_kv(rid)``."""
        await self.pin_and_abort(rid)
        return await self.expose_kv(rid)

    async def pull_kv(self, exposed: ExposedKv) -> ImportedKv:
        """Make this engine read ``exposed`` from the source's Transfer Engine and keep it as
        ``import_kv`` would (the same checks, the same prefix-cache entry); release the source's
        pin only once this returned.

        Raises ``KvTransferUnsupported`` (no Mooncake here, another protocol than the source's,
        or no such endpoint), ``KvTransferFailed`` (the read failed), ``KvCacheIncompatible``,
        ``KvCacheFull``; after each of them the source's pin is still there for ``export_kv``.
        """
        body = engine_api.encode(exposed.to_wire())
        answer = await self._kv_call("/gyre/kv/pull", body, engine_api.KvImported, KvTransferUnsupported)
        return ImportedKv(answer.key, answer.num_tokens, answer.nbytes)

    async def release_kv(self, rid: str) -> engine_api.KvStatus:
        """Unpin ``rid``'s KV (the destination has taken over) and stop exposing its payload;
        ``KvCacheNotFound`` if none."""
        body = engine_api.encode(engine_api.KvRidRequest(rid=rid))
        return await self._kv_call("/gyre/kv/release", body, engine_api.KvStatus)

    async def kv_status(self) -> engine_api.KvStatus:
        """How many caches the engine keeps pinned and imported, their bytes and bounds."""
        response = await self._request("GET", "/gyre/kv/status")
        if response.status != 200:
            raise kv_error_for(response)
        return _decode(response.content, engine_api.KvStatus, "/gyre/kv/status")

    # -- gyre admission (reference engine only) ----------------------------------------------

    async def stop_accepting(self) -> engine_api.AdmissionStatus:
        """New generates get 503 (``EngineNotAccepting``); in-flight ones continue."""
        return await self._call("POST", "/gyre/stop_accepting", None, engine_api.AdmissionStatus)

    async def resume_accepting(self) -> engine_api.AdmissionStatus:
        return await self._call("POST", "/gyre/resume_accepting", None, engine_api.AdmissionStatus)

    async def admission_status(self) -> engine_api.AdmissionStatus:
        return await self._call("GET", "/gyre/status", None, engine_api.AdmissionStatus)


def _decode(content: bytes, kind: type[T], path: str) -> T:
    if kind is bytes:
        return content  # type: ignore[return-value]
    try:
        return engine_api.decode(content, kind)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise EngineProtocolError(f"{path} answered an unexpected body: {exc}") from exc
