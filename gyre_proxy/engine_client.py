"""``EngineClient``: one engine reached over SGLang's native HTTP API.

The same client talks to a real SGLang server and to gyre's reference engine. It is the
only place where ``httpx`` errors and HTTP statuses exist; everything else sees the
``gyre_proxy.exceptions`` tree. It does not retry, route or record: the proxy does that.
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

from gyre_proxy import engine_api
from gyre_proxy.engine_stream import StreamAccumulator, iter_sse_data, result_from_response
from gyre_proxy.engine_types import (
    EngineInfo,
    GenerateDelta,
    GenerateResult,
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
    WeightUpdateFailed,
)

T = TypeVar("T")

NOT_ACCEPTING_MESSAGE = engine_api.NOT_ACCEPTING_MESSAGE
_CONTEXT_MARKERS = ("context length", "maximum context length")


@dataclass(frozen=True)
class EngineClientConfig:
    """Where the engine is and how long to wait for it."""

    base_url: str
    timeout_s: float = 600.0
    connect_timeout_s: float = 5.0


def error_message(response: httpx.Response) -> str:
    """The human message in an error body (SGLang uses several envelopes)."""
    try:
        body: Any = response.json()
    except ValueError:
        return response.text.strip() or f"HTTP {response.status_code}"
    if isinstance(body, dict):
        inner = body.get("error")
        if isinstance(inner, dict) and "message" in inner:
            return str(inner["message"])
        for key in ("message", "detail", "error"):
            if key in body:
                return str(body[key])
    return str(body)


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

    ``transport`` plugs in any httpx transport (``httpx.ASGITransport`` for an in-process app).
    """

    def __init__(
        self, config: EngineClientConfig, *, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self.config = config
        timeout = httpx.Timeout(config.timeout_s, connect=config.connect_timeout_s)
        self._http = httpx.AsyncClient(base_url=config.base_url, timeout=timeout, transport=transport)

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

    async def _request(self, method: str, path: str, body: msgspec.Struct | None = None) -> httpx.Response:
        content = engine_api.encode(body) if body is not None else None
        headers = {"content-type": "application/json"} if content is not None else None
        try:
            return await self._http.request(method, path, content=content, headers=headers)
        except httpx.TimeoutException as exc:
            raise EngineUnavailable(f"{method} {path} timed out: {exc!r}") from exc
        except httpx.TransportError as exc:
            raise EngineUnavailable(f"{method} {path} failed: {exc!r}") from exc

    async def _call(self, method: str, path: str, body: msgspec.Struct | None, kind: type[T]) -> T:
        response = await self._request(method, path, body)
        if response.status_code != 200:
            raise error_for(response.status_code, error_message(response))
        return _decode(response.content, kind, path)

    # -- generation --------------------------------------------------------------------------

    @staticmethod
    def _generate_body(
        input_ids: Sequence[int], sampling: SamplingConfig, rid: str, *, stream: bool
    ) -> engine_api.GenerateRequest:
        return engine_api.GenerateRequest(
            input_ids=[int(token) for token in input_ids],
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
        if response.status_code != 200:
            error = error_for(response.status_code, error_message(response))
            if response.status_code == 500:  # SGLang's scheduler aborted it mid-flight
                raise EngineRequestAborted(str(error)) from error
            raise error
        wire = _decode(response.content, engine_api.GenerateResponse, "/generate")
        return result_from_response(wire, rid)

    async def generate_stream(
        self, input_ids: Sequence[int], sampling: SamplingConfig, *, rid: str | None = None
    ) -> AsyncIterator[GenerateDelta]:
        """Yield increments as the engine produces them; the last carries ``finish``.

        Works with SGLang's cumulative chunks (the default) and incremental ones. Closing the
        iterator early closes the connection, which makes SGLang abort the request.
        """
        rid = rid or uuid.uuid4().hex
        body = self._generate_body(input_ids, sampling, rid, stream=True)
        request = self._http.build_request(
            "POST", "/generate", content=engine_api.encode(body), headers={"content-type": "application/json"}
        )
        try:
            response = await self._http.send(request, stream=True)
        except httpx.TimeoutException as exc:
            raise EngineUnavailable(f"POST /generate timed out: {exc!r}") from exc
        except httpx.TransportError as exc:
            raise EngineUnavailable(f"POST /generate failed: {exc!r}") from exc
        try:
            if response.status_code != 200:
                await response.aread()
                raise error_for(response.status_code, error_message(response))
            accumulator = StreamAccumulator(rid)
            try:
                async for data in iter_sse_data(response.aiter_lines()):
                    delta = accumulator.feed(data)
                    if delta is not None:
                        yield delta
            except httpx.TransportError as exc:
                raise EngineUnavailable(f"stream of {rid} broke: {exc!r}") from exc
            if not accumulator.finished:
                raise EngineRequestAborted(f"stream of {rid} ended without a finish reason")
        finally:
            await response.aclose()

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
        return response.status_code == 200

    async def model_info(self) -> EngineInfo:
        response = await self._request("GET", "/model_info")
        if response.status_code == 404:  # SGLang before the rename
            response = await self._request("GET", "/get_model_info")
        if response.status_code != 200:
            raise error_for(response.status_code, error_message(response))
        wire = _decode(response.content, engine_api.ModelInfo, "/model_info")
        return EngineInfo(wire.model_path, wire.weight_version, wire.context_length)

    async def weight_version(self) -> str:
        answer = await self._call("GET", "/get_weight_version", None, engine_api.WeightVersionResponse)
        return answer.weight_version

    async def flush_cache(self) -> None:
        await self._call("POST", "/flush_cache", None, bytes)

    # -- weights -----------------------------------------------------------------------------

    async def _weight_call(self, path: str, body: msgspec.Struct | None) -> engine_api.WeightUpdateResponse:
        response = await self._request("POST", path, body)
        try:
            answer = engine_api.decode(response.content, engine_api.WeightUpdateResponse)
        except (msgspec.DecodeError, msgspec.ValidationError):
            if response.status_code != 200:
                raise error_for(response.status_code, error_message(response)) from None
            raise EngineProtocolError(f"{path} answered {response.text[:200]!r}") from None
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
        if response.status_code != 200:
            raise error_for(response.status_code, error_message(response))
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
