"""Turning SGLang ``/generate`` answers into gyre results and increments.

SGLang streams ``data: {...}`` server-sent events and ends with ``data: [DONE]``. By default
every chunk is cumulative (all output so far); with ``--incremental-streaming-output`` each
chunk holds only the new tokens. ``meta_info.completion_tokens`` is the running total in
both modes, so the accumulator takes the newest ``total - seen`` entries of each chunk and
needs no knowledge of how the server was launched.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
import numpy as np

from gyre_proxy.engines import wire as engine_api
from gyre_proxy.engines.types import Finish, GenerateDelta, GenerateResult, Logprobs
from gyre_proxy.exceptions import (
    ContextLengthExceeded,
    EngineBadRequest,
    EngineProtocolError,
)

DONE = b"[DONE]"
# One decoder for every streamed chunk: ``msgspec.json.decode(data, type=...)`` looks the
# type up on each call.
_CHUNK = msgspec.json.Decoder(engine_api.GenerateResponse)


class SseData:
    """Cuts the payloads of ``data:`` lines out of a body fed chunk by chunk, up to ``[DONE]``.

    Lines are cut here rather than by the HTTP library: a cumulative SGLang chunk late in a
    long answer is one line of megabytes, arriving in many pieces. A plain object rather than
    an async generator, so the engine stream reads its chunks with one generator fewer
    between the socket and the answer (one resumption fewer per streamed token).
    """

    __slots__ = ("_pending", "done")

    def __init__(self) -> None:
        self._pending: list[bytes] = []  # pieces of a line not yet ended
        self.done = False  # ``[DONE]`` was read: what follows it is not fed

    def feed(self, chunk: bytes) -> list[bytes]:
        """The payloads that ``chunk`` completes, stopping at ``[DONE]`` (then ``done``)."""
        out: list[bytes] = []
        pending = self._pending
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            line = chunk[start:end]
            if pending:
                line = b"".join((*pending, line))
                pending.clear()
            start = end + 1
            if not line.startswith(b"data:"):
                continue  # blank separators, comments, other SSE fields
            payload = line[5:].strip()
            if payload == DONE:
                self.done = True
                return out
            out.append(payload)
        if start < len(chunk):
            pending.append(chunk[start:])
        return out

    def end(self) -> list[bytes]:
        """The body ended: a last line without its newline still counts."""
        line = b"".join(self._pending)
        self._pending.clear()
        if line.startswith(b"data:") and (payload := line[5:].strip()) != DONE:
            return [payload]
        return []


async def iter_sse_data(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The payload of each ``data:`` line in a body arriving as ``chunks``, stopping at ``[DONE]``.

    ``chunks`` is left just past ``[DONE]``, so the caller can read the rest of the body and
    reuse the connection.
    """
    data = SseData()
    async for chunk in chunks:
        for payload in data.feed(chunk):
            yield payload
        if data.done:
            return
    for payload in data.end():
        yield payload


def logprobs_of(meta: engine_api.MetaInfo, count: int) -> Logprobs:
    """The last ``count`` output-token logprobs of ``meta`` as float32."""
    entries = meta.output_token_logprobs or []
    if count and len(entries) < count:
        raise EngineProtocolError(
            f"request {meta.id}: {count} output tokens but {len(entries)} logprobs; "
            "was return_logprob honoured?"
        )
    tail = entries[len(entries) - count :] if count else []
    return np.array([entry[0] for entry in tail], dtype=np.float32)


def result_from_response(wire: engine_api.GenerateResponse, rid: str) -> GenerateResult:
    """A finished non-streamed ``/generate`` answer as a ``GenerateResult``."""
    meta = wire.meta_info
    if meta.finish_reason is None:
        raise EngineProtocolError(f"request {rid}: answer without finish_reason")
    output_ids = np.array(wire.output_ids, dtype=np.int32)
    return GenerateResult(
        rid=meta.id or rid,
        output_ids=output_ids,
        logprobs=logprobs_of(meta, len(output_ids)),
        finish=Finish.from_wire(meta.finish_reason),
        weight_version=meta.weight_version or "",
        prompt_tokens=meta.prompt_tokens,
        text=wire.text,
    )


def _raise_stream_error(payload: bytes) -> None:
    try:
        error = msgspec.json.decode(payload, type=engine_api.ErrorResponse)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return
    message = error.error.message
    if "context length" in message:
        raise ContextLengthExceeded(message)
    raise EngineBadRequest(message)


class StreamAccumulator:
    """Feeds SSE payloads of one request; returns the increment each one adds."""

    def __init__(self, rid: str) -> None:
        self.rid = rid
        self.seen = 0
        self.finished = False

    def feed(self, payload: str | bytes) -> GenerateDelta | None:
        data = payload.encode() if isinstance(payload, str) else payload
        if data.startswith(b'{"error"'):
            _raise_stream_error(data)
        try:
            wire = _CHUNK.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            _raise_stream_error(data)
            raise EngineProtocolError(f"stream of {self.rid}: bad chunk {data[:200]!r}") from exc
        meta = wire.meta_info
        total = meta.completion_tokens or (self.seen + len(wire.output_ids))
        new = max(total - self.seen, 0)
        if new > len(wire.output_ids):
            raise EngineProtocolError(
                f"stream of {self.rid}: chunk claims {total} tokens, carries {len(wire.output_ids)}"
            )
        ids = wire.output_ids[len(wire.output_ids) - new :] if new else []
        finish = Finish.from_wire(meta.finish_reason) if meta.finish_reason is not None else None
        self.seen = total
        self.finished = finish is not None
        if not ids and finish is None:
            return None
        return GenerateDelta(
            rid=meta.id or self.rid,
            output_ids=np.array(ids, dtype=np.int32),
            logprobs=logprobs_of(meta, new),
            finish=finish,
            weight_version=meta.weight_version,
        )
