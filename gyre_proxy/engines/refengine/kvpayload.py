"""Packing a ``KvEntry`` into the KV payload and back (the format is in ``wire.py``).

``unpack`` checks everything against the destination before it reads a tensor: the header's
model layout and weight version, then each declared tensor's dtype and shape, then the token
ids (inside the vocabulary, shorter than the context). A payload from another model, or one
cut short, is a ``PayloadIncompatible``; nothing of it is kept. ``check_descriptor`` is what a
destination can check of a payload it is about to read over Mooncake, before it allocates the
memory for it; ``unpack`` then checks the bytes themselves all the same.
"""

from __future__ import annotations

import numpy as np
import torch

from gyre_proxy.engines import wire as engine_api
from gyre_proxy.engines.refengine.kvcache import CacheLayout, KvEntry
from gyre_proxy.exceptions import KvStoreFull, PayloadIncompatible

# The most header a payload may carry on top of its tensors (the JSON header of a few hundred
# layers is some tens of KB): bounds what a destination allocates for a descriptor's length.
MAX_HEADER_BYTES = 1 << 20

# safetensors' dtype codes for the cache dtypes a model can have.
_CODES = {
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float64: "F64",
}


def _code(dtype: torch.dtype) -> str:
    try:
        return _CODES[dtype]
    except KeyError:
        raise PayloadIncompatible(f"cannot pack a {dtype} cache") from None


def pack(entry: KvEntry, layout: CacheLayout) -> bytes:
    """The payload bytes of ``entry``: a safetensors file with the metadata of ``layout``."""
    from safetensors.torch import save

    _code(layout.dtype)
    tensors: dict[str, torch.Tensor] = {engine_api.KV_TOKEN_IDS: torch.from_numpy(entry.token_ids)}
    for index, (keys, values) in enumerate(zip(entry.keys, entry.values, strict=True)):
        tensors[f"keys.{index}"] = keys.contiguous()
        tensors[f"values.{index}"] = values.contiguous()
    meta = engine_api.KvPayloadMeta(
        format=engine_api.KV_PAYLOAD_FORMAT,
        rid=entry.rid,
        weight_version=entry.weight_version,
        num_tokens=entry.num_tokens,
        model_type=layout.model_type,
        num_layers=layout.num_layers,
        num_kv_heads=layout.num_kv_heads,
        head_dim=layout.head_dim,
        dtype=layout.dtype_name,
    )
    return save(tensors, metadata=meta.to_strings())


def check_header(
    header: engine_api.KvPayloadHeader,
    layout: CacheLayout,
    *,
    weight_version: str,
    vocab_size: int,
    context_length: int,
) -> None:
    """Raise ``PayloadIncompatible`` unless ``header`` describes a cache this engine can use."""
    meta = header.meta
    theirs = (meta.model_type, meta.num_layers, meta.num_kv_heads, meta.head_dim, meta.dtype)
    ours = (layout.model_type, layout.num_layers, layout.num_kv_heads, layout.head_dim, layout.dtype_name)
    if theirs != ours:
        fields = "(model_type, layers, kv_heads, head_dim, dtype)"
        raise PayloadIncompatible(f"the payload's model {fields} is {theirs}, this engine's is {ours}")
    if meta.weight_version != weight_version:
        raise PayloadIncompatible(
            f"the payload's KV was computed under weight version {meta.weight_version!r}, "
            f"this engine serves {weight_version!r}"
        )
    n = meta.num_tokens
    if not 0 < n < context_length:
        raise PayloadIncompatible(
            f"the payload covers {n} tokens; this engine takes 1 to {context_length - 1}"
        )
    expected = {engine_api.KV_TOKEN_IDS} | {
        f"{kind}.{index}" for index in range(layout.num_layers) for kind in ("keys", "values")
    }
    if set(header.tensors) != expected:
        raise PayloadIncompatible(
            f"the payload's tensors are {sorted(header.tensors)}, expected {sorted(expected)}"
        )
    shape = [layout.num_kv_heads, n, layout.head_dim]
    code = _code(layout.dtype)
    for name, spec in header.tensors.items():
        if name != engine_api.KV_TOKEN_IDS and (spec.dtype, spec.shape) != (code, shape):
            raise PayloadIncompatible(f"{name} is {spec.dtype} {spec.shape}, expected {code} {shape}")
    ids = header.token_ids
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise PayloadIncompatible(
            f"the payload's token ids are not all inside the vocabulary of {vocab_size}"
        )


def check_descriptor(
    descriptor: engine_api.KvTransferDescriptor,
    layout: CacheLayout,
    *,
    weight_version: str,
    context_length: int,
    max_bytes: int,
) -> None:
    """Refuse, before any byte is read, a payload that could not be kept: computed under other
    weights or too long (``PayloadIncompatible``), larger than ``max_bytes`` once kept
    (``KvStoreFull``, as ``PrefixCache.put`` would), or whose length does not fit its token
    count (``PayloadIncompatible``)."""
    if descriptor.weight_version != weight_version:
        raise PayloadIncompatible(
            f"the payload's KV was computed under weight version {descriptor.weight_version!r}, "
            f"this engine serves {weight_version!r}"
        )
    n = descriptor.num_tokens
    if not 0 < n < context_length:
        raise PayloadIncompatible(
            f"the payload covers {n} tokens; this engine takes 1 to {context_length - 1}"
        )
    tensors = n * (layout.bytes_per_token() + 4)  # keys and values of every layer, and the ids
    if tensors > max_bytes:
        raise KvStoreFull(
            f"the payload ({tensors} bytes of tensors) exceeds the import bound of {max_bytes} bytes"
        )
    if not tensors + 8 < descriptor.nbytes <= tensors + 8 + MAX_HEADER_BYTES:
        raise PayloadIncompatible(
            f"a payload of {n} tokens of this model is {tensors + 8} bytes and a header of at most "
            f"{MAX_HEADER_BYTES}, not {descriptor.nbytes}"
        )


def unpack(
    data: bytes,
    layout: CacheLayout,
    *,
    weight_version: str,
    vocab_size: int,
    context_length: int,
) -> KvEntry:
    """The entry in payload ``data``; raises ``PayloadIncompatible`` if it does not fit (see
    ``check_header``) or is malformed."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        header = engine_api.read_kv_payload(data)
    except ValueError as exc:
        raise PayloadIncompatible(str(exc)) from exc
    check_header(
        header, layout, weight_version=weight_version, vocab_size=vocab_size, context_length=context_length
    )
    try:
        tensors = load(data)
    except SafetensorError as exc:
        raise PayloadIncompatible(f"the payload's tensors do not load: {exc}") from exc
    count = range(layout.num_layers)
    return KvEntry(
        rid=header.meta.rid,
        token_ids=np.ascontiguousarray(header.token_ids, dtype=np.int32),
        keys=tuple(tensors[f"keys.{index}"] for index in count),
        values=tuple(tensors[f"values.{index}"] for index in count),
        weight_version=header.meta.weight_version,
    )
