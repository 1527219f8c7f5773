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

from gyre_proxy import engine_api
from gyre_proxy.engine_types import Finish, GenerateDelta, GenerateResult, Logprobs
from gyre_proxy.exceptions import (
    ContextLengthExceeded,
    EngineBadRequest,
    EngineProtocolError,
)

DONE = "[DONE]"


async def iter_sse_data(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    """The payload of each ``data:`` line, stopping at ``[DONE]``."""
    async for line in lines:
        if not line.startswith("data:"):
            continue  # blank separators, comments, other SSE fields
        payload = line[len("data:") :].strip()
        if payload == DONE:
            return
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

    def feed(self, payload: str) -> GenerateDelta | None:
        data = payload.encode()
        if data.startswith(b'{"error"'):
            _raise_stream_error(data)
        try:
            wire = engine_api.decode(data, engine_api.GenerateResponse)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            _raise_stream_error(data)
            raise EngineProtocolError(f"stream of {self.rid}: bad chunk {payload[:200]!r}") from exc
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
