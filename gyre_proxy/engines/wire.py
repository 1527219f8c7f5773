"""Wire types of SGLang's native HTTP API, the subset gyre speaks.

Field names follow SGLang's ``io_struct.py`` and ``http_server.py`` (0.5.x): ``/generate``
takes ``input_ids`` and ``sampling_params`` and answers ``text``, ``output_ids`` and
``meta_info``. Requests omit unset fields so a real server applies its own defaults; responses
ignore fields gyre does not read (SGLang adds timing and cache fields freely). The
``/gyre/...`` admin types exist only on gyre's reference engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, TypeVar

import msgspec
import numpy as np
import numpy.typing as npt

T = TypeVar("T")

FinishType = Literal["stop", "length", "abort"]

# gyre's reference engine answers 503 with this message while it is draining.
NOT_ACCEPTING_MESSAGE = "engine is not accepting new requests"

# SGLang answers every rejected request with this envelope (``_create_error_response``).
ERROR_KEY = "error"


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``sampling_params`` of ``/generate``; ``temperature == 0`` means greedy."""

    max_new_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    sampling_seed: int | None = None


class GenerateRequest(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Body of ``POST /generate`` (single request, token ids in)."""

    input_ids: list[int]
    sampling_params: SamplingParams = msgspec.field(default_factory=SamplingParams)
    rid: str | None = None
    return_logprob: bool | None = None
    logprob_start_len: int | None = None
    stream: bool = False


class FinishReason(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``meta_info.finish_reason``: ``matched`` is the stop token id (or string) that ended it."""

    type: FinishType
    matched: int | str | None = None
    length: int | None = None
    message: str | None = None
    status_code: int | None = None


class MetaInfo(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``meta_info`` of a ``/generate`` answer; logprob entries are ``[logprob, id, text|null]``."""

    id: str
    finish_reason: FinishReason | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int | None = None
    weight_version: str | None = None
    output_token_logprobs: list[tuple[float, int, str | None]] | None = None
    input_token_logprobs: list[tuple[float | None, int, str | None]] | None = None


class GenerateResponse(msgspec.Struct, frozen=True, kw_only=True):
    """One ``/generate`` answer, or one SSE chunk of a streamed one.

    SGLang streams cumulative chunks by default (every chunk repeats all output so far) and
    deltas under ``--incremental-streaming-output``; ``text`` is null on intermediate
    cumulative chunks in recent versions.
    """

    meta_info: MetaInfo
    output_ids: list[int] = msgspec.field(default_factory=list)
    text: str | None = None


class ErrorDetail(msgspec.Struct, frozen=True):
    message: str


class ErrorResponse(msgspec.Struct, frozen=True):
    """``{"error": {"message": ...}}``, SGLang's body for a rejected request."""

    error: ErrorDetail


class AbortRequest(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Body of ``POST /abort_request``."""

    rid: str = ""
    abort_all: bool = False


class ModelInfo(msgspec.Struct, frozen=True, kw_only=True):
    """Answer of ``GET /model_info`` (``/get_model_info`` on older servers)."""

    model_path: str
    tokenizer_path: str | None = None
    is_generation: bool = True
    weight_version: str | None = None
    # gyre's reference engine also reports these; SGLang leaves them out.
    context_length: int | None = None
    vocab_size: int | None = None
    # The ``load_format`` values ``/update_weights_from_tensor`` accepts. Absent on SGLang,
    # which takes its own pickled payload (``load_format`` unset) from a same-host sender.
    tensor_load_formats: list[str] | None = None


class WeightVersionResponse(msgspec.Struct, frozen=True):
    """Answer of ``GET /get_weight_version``."""

    weight_version: str


class UpdateWeightVersionRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Body of ``POST /update_weight_version``."""

    new_version: str
    abort_all_requests: bool = False


class UpdateWeightsFromDiskRequest(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Body of ``POST /update_weights_from_disk``; ``weight_version`` becomes the server's."""

    model_path: str
    load_format: str | None = None
    abort_all_requests: bool = False
    weight_version: str | None = None
    flush_cache: bool = True


class UpdateWeightsFromTensorRequest(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Body of ``POST /update_weights_from_tensor`` (one serialized payload per TP rank)."""

    serialized_named_tensors: list[str]
    load_format: str | None = None
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: str | None = None


class InitWeightsUpdateGroupRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Body of ``POST /init_weights_update_group``; the trainer is rank 0 of the group.

    An engine's TP rank ``r`` joins as ``rank_offset + r``. The call blocks the engine (SGLang:
    its whole scheduler) until every rank has joined, so rank 0 must already be listening.
    """

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str = "weight_update_group"
    backend: str = "gloo"


class UpdateWeightsFromDistributedRequest(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Body of ``POST /update_weights_from_distributed``: tensors arrive by broadcast from rank 0.

    Like ``/update_weights_from_tensor`` it must run inside a ``/begin_weight_update`` session
    (SGLang 0.5.23 refuses it otherwise, before receiving anything).
    """

    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str = "weight_update_group"
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: str | None = None
    load_format: str | None = None


class DestroyWeightsUpdateGroupRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Body of ``POST /destroy_weights_update_group``."""

    group_name: str = "weight_update_group"


class WeightUpdateResponse(msgspec.Struct, frozen=True, kw_only=True):
    """Answer of every weight-update endpoint (200 on success, 400 otherwise)."""

    success: bool
    message: str = ""
    num_paused_requests: int | None = None


class MemoryOccupationRequest(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Body of ``/release_memory_occupation`` and ``/resume_memory_occupation``."""

    tags: list[str] | None = None


class EmptyRequest(msgspec.Struct, frozen=True):
    """Body of endpoints that take no fields (``/begin_weight_update``, ``/end_weight_update``)."""


class AdmissionStatus(msgspec.Struct, frozen=True, kw_only=True):
    """Answer of the reference engine's ``/gyre/...`` admission endpoints."""

    accepting: bool
    in_flight: int
    weight_version: str


def _encode_numpy(value: Any) -> Any:
    # Called only for objects msgspec cannot encode itself, so plain ints never pay for it.
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise NotImplementedError(f"cannot encode {type(value).__name__} as JSON")


_encoder = msgspec.json.Encoder(enc_hook=_encode_numpy)


def token_list(ids: Sequence[int] | npt.NDArray[np.integer[Any]]) -> list[int]:
    """``ids`` as a list for ``GenerateRequest.input_ids``, without a Python loop per token.

    An array becomes Python ints in one ``tolist``; a list is used as it is (numpy integers
    in it are encoded by the encoder's hook), so a 100k-token context costs about 1 ms here
    instead of the 7 ms an ``int()`` per token took.
    """
    if isinstance(ids, np.ndarray):
        return ids.tolist()  # type: ignore[no-any-return]
    return ids if isinstance(ids, list) else list(ids)


def encode(value: msgspec.Struct) -> bytes:
    """JSON bytes of a wire structure."""
    return _encoder.encode(value)


def decode(data: bytes | str, kind: type[T]) -> T:
    """Decode JSON ``data`` into ``kind``; raises ``msgspec.ValidationError`` on a mismatch."""
    return msgspec.json.decode(data, type=kind)


def to_builtins(value: msgspec.Struct) -> Any:
    """Plain JSON-ready builtins of a wire structure."""
    return msgspec.to_builtins(value)
