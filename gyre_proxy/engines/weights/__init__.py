"""Moving weights to an engine: the weight-update wire (tensor payloads, the trainer's end of
a broadcast group) and ``EngineWeightSink``, one engine as the destination of published
weights over SGLang's weight-update API. Needs torch, so ``gyre_proxy.engines`` does not
import it; it knows nothing of what trains the weights.
"""

from __future__ import annotations

from gyre_proxy.engines.weights.payloads import (
    GYRE_SAFETENSORS_FORMAT,
    TensorSet,
    WeightUpdateGroup,
    deserialize_safetensors,
    distributed_request,
    dtype_from_name,
    dtype_name,
    open_weight_update_group,
    safetensors_payload,
    serialize_for_sglang,
    serialize_safetensors,
    sglang_tensor_payload,
)
from gyre_proxy.engines.weights.sink import BroadcastGroup, EngineWeightSink

__all__ = [
    "GYRE_SAFETENSORS_FORMAT",
    "BroadcastGroup",
    "EngineWeightSink",
    "TensorSet",
    "WeightUpdateGroup",
    "deserialize_safetensors",
    "distributed_request",
    "dtype_from_name",
    "dtype_name",
    "open_weight_update_group",
    "safetensors_payload",
    "serialize_for_sglang",
    "serialize_safetensors",
    "sglang_tensor_payload",
]
