"""A Hugging Face Qwen3 checkpoint as a Megatron-core GPTModel, and back.

`qwen3_spec` reads a save_pretrained folder's config into a `MegatronModelSpec`;
`megatron_state` maps the folder's weights to the TP=1, PP=1 Megatron names and layouts that
`megatron_model.load_weights` splits over the ranks; `hf_state` is the inverse, used by the export.
The layouts that differ:

- attention input: Hugging Face keeps q_proj [H*d, h], k_proj and v_proj [G*d, h]; Megatron one
  linear_qkv whose rows go by query group, each group its H/G query heads, then its key head,
  then its value head;
- SwiGLU input: gate_proj and up_proj become one linear_fc1 of rows [gate; up];
- tied embeddings: Hugging Face's state may hold lm_head.weight as a copy of the embedding,
  Megatron none (its output layer reads the embedding).

Every other weight keeps its values under another name.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from gyre_train.backends.megatron_model import MegatronModelSpec
from gyre_train.exceptions import InvalidConfigError

# Per layer: Hugging Face name -> Megatron name, for the weights whose layout is the same.
_SAME_LAYOUT = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attn.o_proj.weight": "self_attention.linear_proj.weight",
    "self_attn.q_norm.weight": "self_attention.q_layernorm.weight",
    "self_attn.k_norm.weight": "self_attention.k_layernorm.weight",
    "post_attention_layernorm.weight": "pre_mlp_layernorm.weight",
    "mlp.down_proj.weight": "mlp.linear_fc2.weight",
}


def read_config(folder: Path) -> dict[str, Any]:
    """The checkpoint's config.json; raises InvalidConfigError unless it is a Qwen3."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise InvalidConfigError(f"{folder} holds no model (no config.json from save_pretrained)")
    config: dict[str, Any] = json.loads(path.read_text())
    if config.get("model_type") != "qwen3":
        raise InvalidConfigError(
            f"the Megatron backend loads Qwen3 checkpoints, {folder} is {config.get('model_type')!r}"
        )
    return config


def qwen3_spec(
    folder: Path, *, seed: int = 0, torch_threads: int = 1, max_sequence_length: int = 4096
) -> MegatronModelSpec:
    """The GPTModel of the Qwen3 checkpoint in `folder`, which loads its weights."""
    config = read_config(folder)
    rope = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or {}
    if rope.get("rope_type", "default") != "default" or scaling.get("rope_type", "default") != "default":
        raise InvalidConfigError("scaled rotary positions (rope_type other than default) are not built")
    if config.get("attention_bias", False):
        raise InvalidConfigError("Qwen3 attention with biases is not built")
    if config.get("hidden_act", "silu") != "silu":
        raise InvalidConfigError(f"the MLP activation must be silu, not {config.get('hidden_act')!r}")
    heads = int(config["num_attention_heads"])
    return MegatronModelSpec(
        num_layers=int(config["num_hidden_layers"]),
        hidden_size=int(config["hidden_size"]),
        num_attention_heads=heads,
        vocab_size=int(config["vocab_size"]),
        max_sequence_length=max_sequence_length,
        ffn_hidden_size=int(config["intermediate_size"]),
        seed=seed,
        torch_threads=torch_threads,
        architecture="qwen3",
        num_query_groups=int(config.get("num_key_value_heads") or heads),
        kv_channels=int(config.get("head_dim") or int(config["hidden_size"]) // heads),
        rotary_base=float(rope.get("rope_theta", config.get("rope_theta", 10_000.0))),
        norm_epsilon=float(config.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        checkpoint=Path(folder),
    )


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's safetensors files (one file or shards), in float32."""
    from safetensors.torch import load_file

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise InvalidConfigError(f"{folder} holds no .safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update({k: v.float() for k, v in load_file(str(file)).items()})
    return state


def _heads(spec: MegatronModelSpec) -> tuple[int, int, int]:
    """(query heads per group, groups, head dimension)."""
    groups = spec.num_query_groups or spec.num_attention_heads
    head_dim = spec.kv_channels or spec.hidden_size // spec.num_attention_heads
    return spec.num_attention_heads // groups, groups, head_dim


def megatron_state(spec: MegatronModelSpec, hf: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Hugging Face Qwen3 weights -> the TP=1, PP=1 GPTModel state (names and layouts)."""
    per_group, groups, head_dim = _heads(spec)

    def take(name: str) -> torch.Tensor:
        if name not in hf:
            raise InvalidConfigError(f"the checkpoint has no {name!r}: not a {spec.num_layers}-layer Qwen3")
        return hf[name]

    state = {"embedding.word_embeddings.weight": take("model.embed_tokens.weight")}
    for i in range(spec.num_layers):
        h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        for theirs, ours in _SAME_LAYOUT.items():
            state[m + ours] = take(h + theirs)
        q = take(h + "self_attn.q_proj.weight").reshape(groups, per_group * head_dim, -1)
        k = take(h + "self_attn.k_proj.weight").reshape(groups, head_dim, -1)
        v = take(h + "self_attn.v_proj.weight").reshape(groups, head_dim, -1)
        state[m + "self_attention.linear_qkv.weight"] = torch.cat([q, k, v], dim=1).reshape(-1, q.shape[-1])
        state[m + "mlp.linear_fc1.weight"] = torch.cat(
            [take(h + "mlp.gate_proj.weight"), take(h + "mlp.up_proj.weight")]
        )
    state["decoder.final_layernorm.weight"] = take("model.norm.weight")
    if not spec.tie_embeddings:
        state["output_layer.weight"] = take("lm_head.weight")
    return {name: t.contiguous() for name, t in state.items()}


def hf_state(spec: MegatronModelSpec, megatron: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The TP=1, PP=1 GPTModel state -> Hugging Face Qwen3 weights (`megatron_state` undone);
    with tied embeddings lm_head.weight is the embedding, as Hugging Face's state dict has it."""
    per_group, groups, head_dim = _heads(spec)

    def take(name: str) -> torch.Tensor:
        if name not in megatron:
            raise InvalidConfigError(
                f"the Megatron state has no {name!r}: not a {spec.num_layers}-layer Qwen3"
            )
        return megatron[name].detach().clone()

    embedding = take("embedding.word_embeddings.weight")
    state = {"model.embed_tokens.weight": embedding}
    for i in range(spec.num_layers):
        h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        for theirs, ours in _SAME_LAYOUT.items():
            state[h + theirs] = take(m + ours)
        qkv = take(m + "self_attention.linear_qkv.weight")
        blocks = qkv.reshape(groups, (per_group + 2) * head_dim, -1)
        q, k, v = blocks.split([per_group * head_dim, head_dim, head_dim], dim=1)  # type: ignore[no-untyped-call]
        state[h + "self_attn.q_proj.weight"] = q.reshape(-1, qkv.shape[-1]).contiguous()
        state[h + "self_attn.k_proj.weight"] = k.reshape(-1, qkv.shape[-1]).contiguous()
        state[h + "self_attn.v_proj.weight"] = v.reshape(-1, qkv.shape[-1]).contiguous()
        gate, up = take(m + "mlp.linear_fc1.weight").chunk(2)
        state[h + "mlp.gate_proj.weight"] = gate.contiguous()
        state[h + "mlp.up_proj.weight"] = up.contiguous()
    state["model.norm.weight"] = take("decoder.final_layernorm.weight")
    state["lm_head.weight"] = embedding if spec.tie_embeddings else take("output_layer.weight")
    return state
