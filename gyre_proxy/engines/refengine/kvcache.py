"""A request's KV cache taken out of the decode loop, and put back into a new request.

``KvEntry`` is the cache of one sequence as plain per-layer tensors, keyed by the token ids it
covers: the source pins one when it aborts a request, the destination keeps imported ones as
prefix-cache entries. Only models whose transformers cache is plain per-layer keys and values
(``DynamicLayer``: full attention, no sliding window, no recurrent state) can migrate; for the
others ``cache_layout`` is None and every KV call is refused. The refusals here are
``RequestRejected`` with a machine-readable ``code``, which the HTTP layer puts in the error
body and ``EngineClient`` turns into the ``KvMigrationError`` tree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from gyre_proxy.exceptions import (
    CacheNotMigratable,
)


@dataclass(frozen=True)
class CacheLayout:
    """What a cache must look like to fit the model: one keys and one values tensor per layer,
    each ``[num_kv_heads, num_tokens, head_dim]`` in ``dtype``."""

    model_type: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    def bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype.itemsize


def cache_layout(model: torch.nn.Module) -> CacheLayout | None:
    """The layout of ``model``'s KV cache, or None when it is not plain per-layer keys and values."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    config: Any = getattr(model, "config", None)
    if config is None:
        return None
    config = config.get_text_config(decoder=True)
    heads = int(config.num_attention_heads)
    layers = DynamicCache(config=config).layers
    if not layers or any(type(layer) is not DynamicLayer for layer in layers):
        return None
    return CacheLayout(
        model_type=str(config.model_type),
        num_layers=len(layers),
        num_kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(config, "head_dim", None) or config.hidden_size // heads),
        dtype=next(model.parameters()).dtype,
    )


@dataclass(frozen=True, eq=False)
class KvEntry:
    """The KV of one sequence: position ``i`` of every tensor is token ``token_ids[i]``'s."""

    rid: str
    token_ids: npt.NDArray[np.int32]  # [N]
    keys: tuple[torch.Tensor, ...]  # per layer [num_kv_heads, N, head_dim]
    values: tuple[torch.Tensor, ...]  # per layer [num_kv_heads, N, head_dim]
    weight_version: str  # the weights the KV was computed under

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def nbytes(self) -> int:
        tensors = (*self.keys, *self.values)
        return int(self.token_ids.nbytes) + sum(t.numel() * t.element_size() for t in tensors)


def entry_from_cache(
    cache: Any, token_ids: list[int], *, rid: str, weight_version: str, layout: CacheLayout
) -> KvEntry:
    """The entry of a request's ``cache`` (a ``DynamicCache``) that covers ``token_ids``; the
    cache's tensors are taken as they are (the request drops its cache, so nothing writes them)."""
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    expected = (1, layout.num_kv_heads, len(token_ids), layout.head_dim)
    for index, layer in enumerate(cache.layers):
        for kind, tensor, out in (("keys", layer.keys, keys), ("values", layer.values, values)):
            if tensor is None or tuple(tensor.shape) != expected:
                shape = None if tensor is None else tuple(tensor.shape)
                raise CacheNotMigratable(
                    f"request {rid}: layer {index} {kind} are {shape}, not {expected}; "
                    "its cache does not cover every position"
                )
            # [num_kv_heads, N, head_dim], in host memory: entries are served, migrated and
            # matched as bytes whatever device the engine decodes on.
            out.append(tensor[0].cpu())
    if len(keys) != layout.num_layers:
        raise CacheNotMigratable(
            f"request {rid}: {len(keys)} cache layers, the model has {layout.num_layers}"
        )
    return KvEntry(rid, np.asarray(token_ids, dtype=np.int32), tuple(keys), tuple(values), weight_version)


def cache_from_entry(entry: KvEntry, length: int, config: Any, device: torch.device | None = None) -> Any:
    """A new ``DynamicCache`` holding the first ``length`` positions of ``entry``.

    ``DynamicLayer.update`` concatenates, so the new cache owns copies: decoding into it never
    writes the entry, which stays valid for the next request that shares its prefix. ``device``:
    where the engine decodes (the entry's own device when None).
    """
    from transformers import DynamicCache

    cache = DynamicCache(config=config)
    for index, (keys, values) in enumerate(zip(entry.keys, entry.values, strict=True)):
        # [num_kv_heads, N, head_dim] -> [1, num_kv_heads, length, head_dim]
        if device is not None:
            keys, values = keys.to(device), values.to(device)
        cache.update(keys[None, :, :length], values[None, :, :length], index)
    return cache
