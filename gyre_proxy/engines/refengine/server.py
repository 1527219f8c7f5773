"""The reference engine's HTTP API: SGLang's native endpoints plus gyre's ``/gyre/...`` admin.

``build_app(engine)`` returns a Starlette app. Answers follow SGLang: ``/generate`` returns
``text``, ``output_ids`` and ``meta_info``; streamed chunks are ``data: {...}`` events,
cumulative unless the engine runs with ``incremental_streaming_output``, ended by
``data: [DONE]``; a request rejected before it starts gets ``{"error": {"message": ...}}``
(status 400, or inside the stream for ``stream: true``). Closing a stream aborts its request.
``/gyre/kv/...`` migrates a request's KV cache: the payload is binary (``wire.py``), or, over
Mooncake, a JSON descriptor of where it lies in the source's memory; a refusal carries a
``code`` beside its message. ``/pause_generation`` (modes ``in_place`` and ``abort``) and
``/continue_generation`` behave as SGLang's: while paused, new requests wait and a weight
update runs at once. ``/metrics`` gives the engine's Prometheus metrics (``metrics.py``).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from gyre_proxy.engines import wire as engine_api
from gyre_proxy.engines.client import ContinueGenerationRequest, PauseGenerationRequest
from gyre_proxy.engines.refengine.decode_loop import StepEvent
from gyre_proxy.engines.refengine.engine import ReferenceEngine
from gyre_proxy.engines.refengine.metrics import CONTENT_TYPE, engine_registry, exposition
from gyre_proxy.engines.weights import GYRE_SAFETENSORS_FORMAT
from gyre_proxy.exceptions import KvRefused, ModelLoadError, RequestRejected

T = TypeVar("T")
JSON = "application/json"
# SGLang's answers to /pause_generation and /continue_generation
PAUSED = {"message": "Generation paused successfully.", "status": "ok"}
CONTINUED = {"message": "Generation continued successfully.", "status": "ok"}


def _json(value: msgspec.Struct, status: int = 200) -> Response:
    return Response(engine_api.encode(value), status_code=status, media_type=JSON)


def _error(message: str, status: int = 400) -> Response:
    return _json(engine_api.ErrorResponse(engine_api.ErrorDetail(message)), status)


async def _body(request: Request, kind: type[T]) -> T:
    raw = await request.body()
    try:
        return engine_api.decode(raw or b"{}", kind)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise RequestRejected(f"invalid request body: {exc}") from exc


@dataclass
class _Output:
    """Everything produced so far for one request."""

    rid: str
    prompt_tokens: int
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    event: StepEvent | None = None
    cached_tokens: int = 0

    def add(self, event: StepEvent) -> None:
        if event.token is not None and event.logprob is not None:
            self.ids.append(event.token)
            self.logprobs.append(event.logprob)
        self.event = event
        self.cached_tokens = event.cached_tokens

    def response(
        self, engine: ReferenceEngine, *, return_logprob: bool, since: int = 0
    ) -> engine_api.GenerateResponse:
        assert self.event is not None
        finish = self.event.finish
        ids = self.ids[since:]
        meta = engine_api.MetaInfo(
            id=self.rid,
            finish_reason=finish.to_wire(length=len(self.ids)) if finish is not None else None,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=len(self.ids),
            cached_tokens=self.cached_tokens,
            weight_version=self.event.weight_version,
            output_token_logprobs=(
                [(lp, token, None) for lp, token in zip(self.logprobs[since:], ids, strict=True)]
                if return_logprob
                else None
            ),
        )
        text = engine.loaded.tokenizer.decode(ids)
        return engine_api.GenerateResponse(meta_info=meta, output_ids=ids, text=text)


def build_app(engine: ReferenceEngine) -> Starlette:
    """The Starlette app serving ``engine``."""

    def rejected(
        handler: Callable[[Request], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def wrapped(request: Request) -> Response:
            try:
                return await handler(request)
            except KvRefused as exc:
                detail = engine_api.KvErrorDetail(message=str(exc), code=exc.code)
                return _json(engine_api.KvErrorResponse(detail), exc.status)
            except RequestRejected as exc:
                return _error(str(exc), exc.status)

        return wrapped

    async def generate(request: Request) -> Response:
        body = await _body(request, engine_api.GenerateRequest)
        rid = body.rid or uuid.uuid4().hex
        await engine.wait_while_paused()  # as SGLang, a request sent while paused waits
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[StepEvent] = asyncio.Queue()

        def sink(event: StepEvent) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, event)

        try:
            engine.submit(body, rid, sink)
        except RequestRejected as exc:
            if body.stream and exc.status == 400:  # SGLang reports these inside the stream
                return StreamingResponse(_error_stream(str(exc)), media_type="text/event-stream")
            raise
        output = _Output(rid, len(body.input_ids))
        logprob = bool(body.return_logprob)
        if body.stream:
            incremental = engine.config.incremental_streaming_output
            return StreamingResponse(
                _stream(engine, output, queue, return_logprob=logprob, incremental=incremental),
                media_type="text/event-stream",
            )
        while output.event is None or output.event.finish is None:
            output.add(await queue.get())
        return _json(output.response(engine, return_logprob=logprob))

    async def abort_request(request: Request) -> Response:
        body = await _body(request, engine_api.AbortRequest)
        engine.abort(None if body.abort_all else body.rid)
        return Response(status_code=200)

    async def pause_generation(request: Request) -> Response:
        body = await _body(request, PauseGenerationRequest)
        await engine.pause_generation(body.mode)
        return Response(msgspec.json.encode(PAUSED), media_type=JSON)

    async def continue_generation(request: Request) -> Response:
        await _body(request, ContinueGenerationRequest)
        engine.continue_generation()
        return Response(msgspec.json.encode(CONTINUED), media_type=JSON)

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    registry = engine_registry(engine)

    async def metrics(request: Request) -> Response:
        return Response(exposition(registry), media_type=CONTENT_TYPE)

    def info() -> engine_api.ModelInfo:
        return engine_api.ModelInfo(
            model_path=engine.loaded.model_path,
            tokenizer_path=engine.loaded.model_path,
            weight_version=engine.weight_version,
            context_length=engine.context_length,
            vocab_size=engine.loaded.vocab_size,
            tensor_load_formats=[GYRE_SAFETENSORS_FORMAT],
        )

    async def model_info(request: Request) -> Response:
        return _json(info())

    async def weight_version(request: Request) -> Response:
        return _json(engine_api.WeightVersionResponse(engine.weight_version))

    async def flush_cache(request: Request) -> Response:
        # The prefix cache is the imported KV (pinned caches are not a cache: a migration holds
        # them). Like SGLang, refuse while requests are in flight.
        if engine.loop.in_flight > 0:
            return Response("Cache not flushed: requests are in flight.\n", status_code=400)
        engine.flush_prefix_cache()
        return Response("Cache flushed.\n", status_code=200)

    def weight_answer(message: str, version: str | None, *, paused: bool = False) -> Response:
        if version is not None:
            message += f" Weight version updated to {version}."
        return _json(
            engine_api.WeightUpdateResponse(
                success=True, message=message, num_paused_requests=0 if paused else None
            )
        )

    def weights(
        handler: Callable[[Request], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def wrapped(request: Request) -> Response:
            try:
                return await handler(request)
            except ModelLoadError as exc:
                return _json(engine_api.WeightUpdateResponse(success=False, message=str(exc)), 400)

        return wrapped

    async def update_from_disk(request: Request) -> Response:
        body = await _body(request, engine_api.UpdateWeightsFromDiskRequest)
        count = await engine.update_weights_from_disk(body)
        return weight_answer(
            f"Succeeded to update model weights ({count} tensors).", body.weight_version, paused=True
        )

    async def update_from_tensor(request: Request) -> Response:
        body = await _body(request, engine_api.UpdateWeightsFromTensorRequest)
        count = await engine.update_weights_from_tensor(body)
        return weight_answer(f"Succeeded to update model weights ({count} tensors).", body.weight_version)

    async def begin_update(request: Request) -> Response:
        await _body(request, engine_api.EmptyRequest)
        engine.begin_weight_update()
        return _json(engine_api.WeightUpdateResponse(success=True, message="Success"))

    async def end_update(request: Request) -> Response:
        await _body(request, engine_api.EmptyRequest)
        engine.end_weight_update()
        return _json(engine_api.WeightUpdateResponse(success=True, message="Success"))

    async def init_group(request: Request) -> Response:
        body = await _body(request, engine_api.InitWeightsUpdateGroupRequest)
        await engine.init_weights_update_group(body)
        return _json(engine_api.WeightUpdateResponse(success=True, message="Succeeded to initialize group."))

    async def destroy_group(request: Request) -> Response:
        body = await _body(request, engine_api.DestroyWeightsUpdateGroupRequest)
        engine.destroy_weights_update_group(body.group_name)
        return _json(
            engine_api.WeightUpdateResponse(
                success=True, message="Succeeded to destroy custom process group."
            )
        )

    async def update_from_distributed(request: Request) -> Response:
        body = await _body(request, engine_api.UpdateWeightsFromDistributedRequest)
        count = await engine.update_weights_from_distributed(body)
        return weight_answer(f"Succeeded to update parameters ({count} tensors).", body.weight_version)

    async def update_weight_version(request: Request) -> Response:
        body = await _body(request, engine_api.UpdateWeightVersionRequest)
        if body.abort_all_requests:
            engine.abort(None)
        engine.set_weight_version(body.new_version)
        return _json(
            engine_api.WeightUpdateResponse(
                success=True, message=f"Weight version updated to {body.new_version}"
            )
        )

    async def release_memory(request: Request) -> Response:
        await _body(request, engine_api.MemoryOccupationRequest)
        if engine.loop.in_flight:
            raise RequestRejected("cannot release memory while requests are in flight")
        engine.memory_released = True
        return Response(status_code=200)

    async def resume_memory(request: Request) -> Response:
        await _body(request, engine_api.MemoryOccupationRequest)
        engine.memory_released = False
        return Response(status_code=200)

    def status() -> Response:
        return _json(
            engine_api.AdmissionStatus(
                accepting=engine.accepting,
                in_flight=engine.loop.in_flight,
                weight_version=engine.weight_version,
            )
        )

    async def stop_accepting(request: Request) -> Response:
        engine.accepting = False
        return status()

    async def resume_accepting(request: Request) -> Response:
        engine.accepting = True
        return status()

    async def gyre_status(request: Request) -> Response:
        return status()

    def kv_status() -> Response:
        pins, imports = engine.loop.pinned, engine.loop.prefixes
        pinned, pinned_bytes = pins.totals()
        imported, imported_bytes = imports.totals()
        exposed, exposed_bytes = engine.exposed.totals()
        mooncake, mooncake_detail = engine.kv_transfer.status()
        return _json(
            engine_api.KvStatus(
                pinned_entries=pinned,
                pinned_bytes=pinned_bytes,
                max_pinned_entries=pins.limits.max_entries,
                max_pinned_bytes=pins.limits.max_bytes,
                imported_entries=imported,
                imported_bytes=imported_bytes,
                max_imported_entries=imports.limits.max_entries,
                max_imported_bytes=imports.limits.max_bytes,
                exposed_entries=exposed,
                exposed_bytes=exposed_bytes,
                mooncake=mooncake,
                mooncake_detail=mooncake_detail,
            )
        )

    async def kv_pin_abort(request: Request) -> Response:
        body = await _body(request, engine_api.KvRidRequest)
        entry = await engine.pin_abort(body.rid)
        return _json(
            engine_api.KvPinned(
                rid=entry.rid,
                num_tokens=entry.num_tokens,
                nbytes=entry.nbytes,
                weight_version=entry.weight_version,
            )
        )

    async def kv_export(request: Request) -> Response:
        body = await _body(request, engine_api.KvRidRequest)
        payload = await engine.export_kv(body.rid)
        return Response(payload, media_type=engine_api.KV_PAYLOAD_MEDIA_TYPE)

    async def kv_import(request: Request) -> Response:
        key, entry = await engine.import_kv(await request.body())
        return _json(engine_api.KvImported(key=key, num_tokens=entry.num_tokens, nbytes=entry.nbytes))

    async def kv_expose(request: Request) -> Response:
        body = await _body(request, engine_api.KvRidRequest)
        exposure = await engine.expose_kv(body.rid)
        entry = exposure.entry
        return _json(
            engine_api.KvTransferDescriptor(
                rid=entry.rid,
                num_tokens=entry.num_tokens,
                weight_version=entry.weight_version,
                nbytes=len(exposure.data),
                segment=exposure.segment,
                address=exposure.address,
                protocol=engine.kv_transfer.protocol,
            )
        )

    async def kv_pull(request: Request) -> Response:
        body = await _body(request, engine_api.KvTransferDescriptor)
        key, entry = await engine.pull_kv(body)
        return _json(engine_api.KvImported(key=key, num_tokens=entry.num_tokens, nbytes=entry.nbytes))

    async def kv_release(request: Request) -> Response:
        body = await _body(request, engine_api.KvRidRequest)
        engine.release_kv(body.rid)
        return kv_status()

    async def kv_status_route(request: Request) -> Response:
        return kv_status()

    routes = [
        Route("/generate", rejected(generate), methods=["POST", "PUT"]),
        Route("/abort_request", rejected(abort_request), methods=["POST"]),
        Route("/pause_generation", rejected(pause_generation), methods=["POST"]),
        Route("/continue_generation", rejected(continue_generation), methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/health_generate", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/model_info", model_info, methods=["GET"]),
        Route("/get_model_info", model_info, methods=["GET"]),
        Route("/get_weight_version", weight_version, methods=["GET"]),
        Route("/flush_cache", flush_cache, methods=["GET", "POST"]),
        Route("/update_weights_from_disk", rejected(weights(update_from_disk)), methods=["POST"]),
        Route("/update_weights_from_tensor", rejected(weights(update_from_tensor)), methods=["POST"]),
        Route("/begin_weight_update", rejected(weights(begin_update)), methods=["POST"]),
        Route("/end_weight_update", rejected(weights(end_update)), methods=["POST"]),
        Route("/init_weights_update_group", rejected(weights(init_group)), methods=["POST"]),
        Route("/destroy_weights_update_group", rejected(weights(destroy_group)), methods=["POST"]),
        Route(
            "/update_weights_from_distributed", rejected(weights(update_from_distributed)), methods=["POST"]
        ),
        Route("/update_weight_version", rejected(update_weight_version), methods=["POST"]),
        Route("/release_memory_occupation", rejected(release_memory), methods=["GET", "POST"]),
        Route("/resume_memory_occupation", rejected(resume_memory), methods=["GET", "POST"]),
        Route("/gyre/stop_accepting", stop_accepting, methods=["POST"]),
        Route("/gyre/resume_accepting", resume_accepting, methods=["POST"]),
        Route("/gyre/status", gyre_status, methods=["GET"]),
        Route("/gyre/kv/pin_abort", rejected(kv_pin_abort), methods=["POST"]),
        Route("/gyre/kv/export", rejected(kv_export), methods=["POST"]),
        Route("/gyre/kv/import", rejected(kv_import), methods=["POST"]),
        Route("/gyre/kv/expose", rejected(kv_expose), methods=["POST"]),
        Route("/gyre/kv/pull", rejected(kv_pull), methods=["POST"]),
        Route("/gyre/kv/release", rejected(kv_release), methods=["POST"]),
        Route("/gyre/kv/status", kv_status_route, methods=["GET"]),
    ]
    return Starlette(routes=routes)


def _sse(value: msgspec.Struct) -> bytes:
    return b"data: " + engine_api.encode(value) + b"\n\n"


async def _error_stream(message: str) -> AsyncIterator[bytes]:
    yield _sse(engine_api.ErrorResponse(engine_api.ErrorDetail(message)))
    yield b"data: [DONE]\n\n"


async def _stream(
    engine: ReferenceEngine,
    output: _Output,
    queue: asyncio.Queue[StepEvent],
    *,
    return_logprob: bool,
    incremental: bool,
) -> AsyncIterator[bytes]:
    sent = 0
    finished = False
    try:
        while not finished:
            events = [await queue.get()]
            while not queue.empty():  # coalesce whatever the decode loop produced meanwhile
                events.append(queue.get_nowait())
            for event in events:
                output.add(event)
            finished = output.event is not None and output.event.finish is not None
            chunk = output.response(engine, return_logprob=return_logprob, since=sent if incremental else 0)
            sent = len(output.ids)
            yield _sse(chunk)
        yield b"data: [DONE]\n\n"
    finally:
        if not finished:  # the client went away: stop decoding for it, as SGLang does
            engine.abort(output.rid)
