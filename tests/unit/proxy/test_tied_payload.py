"""Tensor publication of a checkpoint with tied weights (the embedding shared with the output
layer, as in every ``gyre checkpoint write`` model): the payload holds both names."""

from __future__ import annotations

import base64

import torch
from safetensors.torch import load

from gyre_proxy.engines.weights.payloads import serialize_safetensors


def test_tied_tensors_are_serialized_as_copies() -> None:
    shared = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    tensors = {"model.embed_tokens.weight": shared, "lm_head.weight": shared}
    back = load(base64.b64decode(serialize_safetensors(tensors)))
    assert set(back) == set(tensors)
    assert all(torch.equal(back[name], shared) for name in tensors)
