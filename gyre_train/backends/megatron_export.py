"""Megatron-core GPT weights as a Hugging Face model, so engines can serve what Megatron trains.

`export_model` picks by the spec's architecture: a Qwen3 checkpoint's GPTModel goes back to
Qwen3 (`to_qwen3`: the layouts of megatron_qwen3.py undone, config.json the checkpoint's own);
the seeded GPT to GPT-2, below.

The backend's GPT (learned absolute positions, LayerNorm, GELU MLP, biases, untied output layer)
is GPT-2's architecture; only the layouts differ. Megatron packs the attention input projection
per head as [q_h; k_h; v_h] blocks, GPT-2 as [q; k; v] over all heads, and GPT-2's `Conv1D`
stores weights transposed. `to_gpt2` maps a TP=1, PP=1 state (`full_named_tensors()`) to a
GPT-2 config and state dict; `save_gpt2` writes the folder an engine loads from disk. Grouped
query attention and gated MLPs (which GPT-2 cannot express) are refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gyre_train.backends.megatron import MegatronModelSpec
from gyre_train.backends.megatron_qwen3 import hf_state, read_config
from gyre_train.exceptions import InvalidConfigError


@dataclass(frozen=True, slots=True)
class ExportedModel:
    """A Hugging Face model config (with `model_type`) and its state dict."""

    config: dict[str, Any]
    state: dict[str, torch.Tensor]
    # The optimizer state kept with this publication (MegatronBackend.gathered_training_state).
    training_state: dict[str, Any] | None = None

    def save(self, path: Path) -> Path:
        """`save_pretrained` into `path` (config.json and safetensors); returns `path`."""
        from transformers import AutoConfig, AutoModelForCausalLM

        values = dict(self.config)
        hf_config = AutoConfig.for_model(values.pop("model_type"), **values)
        model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)  # type: ignore[no-untyped-call]
        model.load_state_dict(self.state, strict=True)
        path.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(str(path))
        return path

    def named_tensors(self) -> dict[str, torch.Tensor]:
        return dict(self.state)

    def save_training_state(self, path: Path) -> Path | None:
        """The kept optimizer state to `path` (whole or absent); None when there is none."""
        if self.training_state is None:
            return None
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        torch.save(self.training_state, partial)
        partial.replace(path)
        return path


def gpt2_config(spec: MegatronModelSpec) -> dict[str, Any]:
    """The GPT-2 config equal to `spec`'s GPT (exact GELU, LayerNorm eps 1e-5, no dropout)."""
    return {
        "model_type": "gpt2",
        "vocab_size": spec.vocab_size,
        "n_positions": spec.max_sequence_length,
        "n_embd": spec.hidden_size,
        "n_layer": spec.num_layers,
        "n_head": spec.num_attention_heads,
        "n_inner": spec.ffn_hidden_size or 4 * spec.hidden_size,
        "activation_function": "gelu",
        "layer_norm_epsilon": 1e-5,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "tie_word_embeddings": False,
        "bos_token_id": None,
        "eos_token_id": None,
    }


def _qkv_to_gpt2(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """[3H, ...] per-head [q_h; k_h; v_h] blocks -> [q; k; v] over all heads, same trailing dims."""
    head_dim = weight.shape[0] // (3 * heads)
    blocks = weight.reshape(heads, 3, head_dim, *weight.shape[1:])  # [heads, 3, d, ...]
    return blocks.transpose(0, 1).reshape(weight.shape)


def to_gpt2(spec: MegatronModelSpec, named: Mapping[str, torch.Tensor]) -> ExportedModel:
    """GPT-2 weights from a TP=1, PP=1 Megatron state; raises InvalidConfigError on a mismatch."""
    heads = spec.num_attention_heads
    state: dict[str, torch.Tensor] = {}

    def take(name: str) -> torch.Tensor:
        if name not in named:
            raise InvalidConfigError(f"the Megatron state has no {name!r}: not a {spec.num_layers}-layer GPT")
        return named[name].detach().clone()

    state["transformer.wte.weight"] = take("embedding.word_embeddings.weight")
    state["transformer.wpe.weight"] = take("embedding.position_embeddings.weight")
    for i in range(spec.num_layers):
        m, h = f"decoder.layers.{i}.", f"transformer.h.{i}."
        qkv = take(m + "self_attention.linear_qkv.weight")
        if qkv.shape[0] != 3 * spec.hidden_size:
            raise InvalidConfigError("grouped-query attention has no GPT-2 equivalent")
        fc1 = take(m + "mlp.linear_fc1.weight")
        if fc1.shape[0] != (spec.ffn_hidden_size or 4 * spec.hidden_size):
            raise InvalidConfigError("a gated MLP has no GPT-2 equivalent")
        # Conv1D keeps [in, out]: every linear weight is transposed.
        state[h + "attn.c_attn.weight"] = _qkv_to_gpt2(qkv, heads).t().contiguous()
        state[h + "attn.c_attn.bias"] = _qkv_to_gpt2(take(m + "self_attention.linear_qkv.bias"), heads)
        state[h + "attn.c_proj.weight"] = take(m + "self_attention.linear_proj.weight").t().contiguous()
        state[h + "attn.c_proj.bias"] = take(m + "self_attention.linear_proj.bias")
        state[h + "mlp.c_fc.weight"] = fc1.t().contiguous()
        state[h + "mlp.c_fc.bias"] = take(m + "mlp.linear_fc1.bias")
        state[h + "mlp.c_proj.weight"] = take(m + "mlp.linear_fc2.weight").t().contiguous()
        state[h + "mlp.c_proj.bias"] = take(m + "mlp.linear_fc2.bias")
        for ours, theirs in (("input_layernorm", "ln_1"), ("pre_mlp_layernorm", "ln_2")):
            state[h + theirs + ".weight"] = take(m + ours + ".weight")
            state[h + theirs + ".bias"] = take(m + ours + ".bias")
    state["transformer.ln_f.weight"] = take("decoder.final_layernorm.weight")
    state["transformer.ln_f.bias"] = take("decoder.final_layernorm.bias")
    state["lm_head.weight"] = take("output_layer.weight")
    return ExportedModel(gpt2_config(spec), state)


def to_qwen3(spec: MegatronModelSpec, named: Mapping[str, torch.Tensor]) -> ExportedModel:
    """Qwen3 weights from a TP=1, PP=1 Megatron state of the checkpoint `spec` was read from."""
    if spec.architecture != "qwen3" or spec.checkpoint is None:
        raise InvalidConfigError("to_qwen3 exports the GPTModel of a Qwen3 checkpoint")
    config = {
        k: v
        for k, v in read_config(spec.checkpoint).items()
        if k not in ("transformers_version", "dtype", "torch_dtype")
    }
    return ExportedModel(config, hf_state(spec, named))


def export_model(spec: MegatronModelSpec, named: Mapping[str, torch.Tensor]) -> ExportedModel:
    """The Hugging Face model an engine loads: Qwen3 for a Qwen3 checkpoint, else GPT-2."""
    return to_qwen3(spec, named) if spec.architecture == "qwen3" else to_gpt2(spec, named)
