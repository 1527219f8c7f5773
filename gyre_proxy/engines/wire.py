"""Wire types of SGLang's native HTTP API, the subset gyre speaks.

Field names follow SGLang's ``io_struct.py`` and ``http_server.py`` (0.5.x): ``/generate``
takes ``input_ids`` and ``sampling_params`` and answers ``text``, ``output_ids`` and
``meta_info``. Requests omit unset fields so a real server applies its own defaults; responses
ignore fields gyre does not read (SGLang adds timing and cache fields freely). The
``/gyre/...`` admin types exist only on gyre's reference engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
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


# -- KV-cache migration (gyre's reference engine only) ---------------------------------------

# The payload of ``/gyre/kv/export`` and ``/gyre/kv/import`` is a safetensors file: an 8-byte
# little-endian header length, a JSON header (each tensor's dtype, shape and byte range, and
# string metadata), then the raw little-endian tensor bytes. safetensors rather than a format of
# our own: the header declares every tensor's dtype and shape, so a payload that does not fit
# the engine's model is refused before its data is read; it is never unpickled; the engines
# already read it for weights; and this header can be read without torch (``read_kv_payload``).
KV_PAYLOAD_FORMAT = "gyre_kv_v1"
KV_PAYLOAD_MEDIA_TYPE = "application/octet-stream"
# Tensors: the ids int32 [num_tokens]; layer i's "keys.{i}" and "values.{i}", each
# [num_kv_heads, num_tokens, head_dim] in the cache dtype.
KV_TOKEN_IDS = "token_ids"

# ``error.code`` of a refused KV call; the message says what to do.
KV_NOT_FOUND = "kv_not_found"
KV_CACHE_FULL = "kv_cache_full"
KV_INCOMPATIBLE = "kv_incompatible"
KV_UNSUPPORTED = "kv_unsupported"
KV_TRANSFER_UNSUPPORTED = "kv_transfer_unsupported"  # no Mooncake here: use export and import
KV_TRANSFER_FAILED = "kv_transfer_failed"  # the destination's read from the source failed


class KvRidRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Body of ``/gyre/kv/pin_abort``, ``/gyre/kv/export`` and ``/gyre/kv/release``."""

    rid: str


class KvPinned(msgspec.Struct, frozen=True, kw_only=True):
    """Answer of ``/gyre/kv/pin_abort``: the request is aborted and its KV kept under ``rid``."""

    rid: str
    num_tokens: int  # positions covered: the input ids and every token it produced
    nbytes: int
    weight_version: str


class KvImported(msgspec.Struct, frozen=True, kw_only=True):
    """Answer of ``/gyre/kv/import``: the payload is a prefix-cache entry under ``key``."""

    key: str
    num_tokens: int
    nbytes: int


class KvTransferDescriptor(msgspec.Struct, frozen=True, kw_only=True):
    """Answer of ``/gyre/kv/expose`` and body of ``/gyre/kv/pull``: where a pinned request's
    payload lies in the source's memory, registered with its Mooncake Transfer Engine.

    The bytes at ``address`` are the payload ``/gyre/kv/export`` answers (same format), kept
    until ``/gyre/kv/release``; the destination reads them one-sidedly from ``segment``.
    """

    rid: str
    num_tokens: int
    weight_version: str
    nbytes: int  # the payload's length
    segment: str  # the source's Transfer Engine, "host:rpc_port"
    address: int  # the payload's first byte in the source's address space
    protocol: str  # the source's transport: "tcp", or "rdma" on a cluster


class KvStatus(msgspec.Struct, frozen=True, kw_only=True):
    """Answer of ``/gyre/kv/status`` and ``/gyre/kv/release``: what the engine keeps, and its
    bounds; whether it can move payloads over Mooncake, and how many it exposes that way."""

    pinned_entries: int
    pinned_bytes: int
    max_pinned_entries: int
    max_pinned_bytes: int
    imported_entries: int
    imported_bytes: int
    max_imported_entries: int
    max_imported_bytes: int
    # Defaults: an engine from before the Mooncake path answers without them.
    exposed_entries: int = 0  # payloads registered for /gyre/kv/pull, freed with their pin
    exposed_bytes: int = 0
    mooncake: bool = False  # /gyre/kv/expose and /gyre/kv/pull work on this engine
    mooncake_detail: str = ""  # its segment and protocol, or why it cannot


class KvErrorDetail(msgspec.Struct, frozen=True, kw_only=True):
    message: str
    code: str


class KvErrorResponse(msgspec.Struct, frozen=True):
    """``{"error": {"message": ..., "code": ...}}``: SGLang's error envelope with a KV error code."""

    error: KvErrorDetail


class KvPayloadMeta(msgspec.Struct, frozen=True, kw_only=True):
    """The ``__metadata__`` of a KV payload (safetensors metadata is strings only; numbers are
    converted when read)."""

    format: str
    rid: str
    weight_version: str
    num_tokens: int
    model_type: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str  # torch's name of the cache dtype, for example "float32"

    def to_strings(self) -> dict[str, str]:
        return {name: str(value) for name, value in msgspec.structs.asdict(self).items()}


class KvTensorSpec(msgspec.Struct, frozen=True):
    """One tensor in a safetensors header: its dtype code, shape and byte range after the header."""

    dtype: str
    shape: list[int]
    data_offsets: tuple[int, int]


@dataclass(frozen=True, eq=False)
class KvPayloadHeader:
    """What ``read_kv_payload`` found: the metadata, every tensor's spec, and the token ids."""

    meta: KvPayloadMeta
    tensors: dict[str, KvTensorSpec]
    token_ids: npt.NDArray[np.int32]  # [num_tokens]


def read_kv_payload(data: bytes) -> KvPayloadHeader:
    """Read a KV payload's header and token ids without torch; raises ``ValueError`` when
    ``data`` is not a well-formed payload of this format."""
    if len(data) < 8:
        raise ValueError(f"a KV payload is at least 8 bytes, got {len(data)}")
    size = int.from_bytes(data[:8], "little")
    if size > len(data) - 8:
        raise ValueError(f"the header claims {size} bytes but only {len(data) - 8} follow")
    try:
        header = msgspec.json.decode(data[8 : 8 + size], type=dict[str, Any])
        meta = msgspec.convert(header.pop("__metadata__", None), KvPayloadMeta, strict=False)
        tensors = {name: msgspec.convert(spec, KvTensorSpec) for name, spec in header.items()}
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ValueError(f"not a gyre KV payload: {exc}") from exc
    if meta.format != KV_PAYLOAD_FORMAT:
        raise ValueError(f"payload format {meta.format!r}, expected {KV_PAYLOAD_FORMAT!r}")
    body = len(data) - 8 - size
    for name, spec in tensors.items():
        begin, end = spec.data_offsets
        if not 0 <= begin <= end <= body:
            raise ValueError(f"tensor {name!r} lies outside the payload ({begin}..{end} of {body} bytes)")
    ids = tensors.get(KV_TOKEN_IDS)
    if ids is None or ids.dtype != "I32" or ids.shape != [meta.num_tokens]:
        raise ValueError(f"the payload needs {KV_TOKEN_IDS!r} as I32 [{meta.num_tokens}], got {ids}")
    begin, end = ids.data_offsets
    if end - begin != 4 * meta.num_tokens:
        raise ValueError(f"{KV_TOKEN_IDS!r} spans {end - begin} bytes, not {4 * meta.num_tokens}")
    token_ids = np.frombuffer(data, dtype="<i4", count=meta.num_tokens, offset=8 + size + begin)
    return KvPayloadHeader(meta, tensors, token_ids.astype(np.int32))


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
