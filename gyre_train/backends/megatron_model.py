"""The Megatron-core GPT of one pipeline stage and tensor shard, and its packed inputs.

`build_stage` initialises Megatron's parallel state and builds this rank's part of the GPT that
`MegatronModelSpec` describes; `draw_weights` gives every layout the same model by drawing each
weight at full size from a seed keyed by its TP=1, PP=1 name (`global_names`) and splitting it.
`stage_inputs` and `packed_logprobs` turn a packed micro-step into Megatron's inputs and its
logits back into per-token logprobs. Training (passes, update, optimizer) is megatron.py.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch

from gyre_train.backends.megatron_cpu import megatron_module
from gyre_train.exceptions import InvalidConfigError
from gyre_train.trajectories import MicroStep

# Megatron-core's name for the RNG stream that tensor-parallel regions fork.
_MODEL_PARALLEL_RNG = "model-parallel-rng"
# Megatron draws these from `output_layer_init_method` (std scaled by 1/sqrt(2 * layers)).
_OUTPUT_PROJECTIONS = ("linear_proj.weight", "linear_fc2.weight")
_LAYER_NAME = re.compile(r"^decoder\.layers\.(\d+)\.")


@dataclass(frozen=True, slots=True)
class MegatronModelSpec:
    """A GPTModel's shape and where its weights come from.

    `architecture = "gpt"` (the default): a small GPT (learned absolute positions, LayerNorm,
    GELU, biases, untied output layer) whose weights are drawn from `seed`. Positions are learned
    embeddings because they take the packed position ids directly (they restart at 0 on every
    row). Each weight is drawn at full size from a seed keyed by its TP=1, PP=1 name and then
    split, so every tensor- and pipeline-parallel layout starts from the same model.

    `architecture = "qwen3"` (made by `megatron_qwen3.qwen3_spec` from a checkpoint folder):
    rotary positions, RMSNorm, SwiGLU, grouped-query attention (`num_query_groups`), per-head
    query and key RMSNorm, no biases, the output layer tied to the embedding or not; the weights
    are `checkpoint`'s. Rotary positions count from 0 over the whole packed micro-step instead
    of restarting on each row: attention never crosses a row and a rotary score depends only on
    the distance between query and key, so only rounding differs.
    """

    num_layers: int = 2
    hidden_size: int = 64
    num_attention_heads: int = 4
    vocab_size: int = 512
    max_sequence_length: int = 128
    ffn_hidden_size: int | None = None
    seed: int = 0
    torch_threads: int = 1
    architecture: str = "gpt"  # "gpt" or "qwen3"
    num_query_groups: int | None = None  # key/value heads (None: one per attention head)
    kv_channels: int | None = None  # the head dimension (None: hidden_size / heads)
    rotary_base: float = 10_000.0
    norm_epsilon: float = 1e-5
    tie_embeddings: bool = False
    checkpoint: Path | None = None  # a save_pretrained folder whose weights the model takes

    def __post_init__(self) -> None:
        if self.architecture not in ("gpt", "qwen3"):
            raise InvalidConfigError(f"architecture must be gpt or qwen3, not {self.architecture!r}")
        if self.architecture == "gpt" and self.hidden_size % self.num_attention_heads:
            raise InvalidConfigError("hidden_size must be a multiple of num_attention_heads")
        groups = self.num_query_groups or self.num_attention_heads
        if self.num_attention_heads % groups:
            raise InvalidConfigError("num_attention_heads must be a multiple of num_query_groups")
        if self.architecture == "gpt" and (self.tie_embeddings or self.checkpoint is not None):
            raise InvalidConfigError("the seeded gpt has an untied output layer and no checkpoint")


def build_stage(spec: MegatronModelSpec, tp: int, pp: int, stack: ExitStack) -> tuple[torch.nn.Module, Any]:
    """Initialise the parallel state (undone by `stack`) and build this rank's stage; returns it
    and its TransformerConfig. Weights are Megatron's own draw until `draw_weights`."""
    parallel_state = megatron_module("megatron.core.parallel_state")
    tensor_parallel = megatron_module("megatron.core.tensor_parallel")
    gpt = megatron_module("megatron.core.models.gpt")
    layer_specs = megatron_module("megatron.core.models.gpt.gpt_layer_specs")
    transformer_config = megatron_module("megatron.core.transformer.transformer_config")

    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
    )
    stack.callback(parallel_state.destroy_model_parallel)
    tracker = tensor_parallel.get_cuda_rng_tracker()
    tracker.reset()
    tracker.add(_MODEL_PARALLEL_RNG, spec.seed + 2718)
    qwen3 = spec.architecture == "qwen3"
    if qwen3 and spec.tie_embeddings and pp > 1:
        raise InvalidConfigError(
            "a checkpoint with tied embeddings trains with pipeline parallelism 1 only: the "
            "embedding and the output layer would live on different stages"
        )
    architecture: dict[str, Any] = {}
    if qwen3:
        architecture = {
            "num_query_groups": spec.num_query_groups,
            "kv_channels": spec.kv_channels,
            "normalization": "RMSNorm",
            "layernorm_epsilon": spec.norm_epsilon,
            "gated_linear_unit": True,
            "activation_func": torch.nn.functional.silu,
            "bias_activation_fusion": False,
            "add_bias_linear": False,
            "add_qkv_bias": False,
            "qk_layernorm": True,
            "apply_rope_fusion": False,
        }
    config = transformer_config.TransformerConfig(
        **architecture,
        num_layers=spec.num_layers,
        hidden_size=spec.hidden_size,
        num_attention_heads=spec.num_attention_heads,
        ffn_hidden_size=spec.ffn_hidden_size,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        pipeline_dtype=torch.float32,
        # Stage-to-stage sends as plain isend/irecv pairs, not one batch_isend_irecv (an
        # NCCL-shaped path); the pairs run the same exchange over gloo.
        batch_p2p_comm=False,
        use_cpu_initialization=True,
        params_dtype=torch.float32,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    torch.manual_seed(spec.seed)
    model = gpt.GPTModel(
        config=config,
        transformer_layer_spec=(
            layer_specs.get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm")
            if qwen3
            else layer_specs.get_gpt_layer_local_spec()
        ),
        vocab_size=spec.vocab_size,
        max_sequence_length=spec.max_sequence_length,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        position_embedding_type="rope" if qwen3 else "learned_absolute",
        rotary_base=spec.rotary_base,
        # The seeded GPT is untied: with PP the embedding and the output layer live on
        # different stages, and tying them would make the gradient norm count a shared weight
        # twice. A checkpoint's tying is kept (and then PP is 1, checked above).
        share_embeddings_and_output_weights=spec.tie_embeddings,
        parallel_output=True,
    )
    model.train()
    return model, config


def global_names(model: torch.nn.Module) -> dict[str, str]:
    """This stage's parameter names -> the names a TP=1, PP=1 model gives them."""
    layers = cast(Any, model).decoder.layers
    offsets = {str(i): str(int(layer.layer_number) - 1) for i, layer in enumerate(layers)}

    def rename(name: str) -> str:
        match = _LAYER_NAME.match(name)
        if match is None:
            return name
        return f"decoder.layers.{offsets[match.group(1)]}.{name[match.end() :]}"

    return {name: rename(name) for name, _ in model.named_parameters()}


@torch.no_grad()
def draw_weights(
    model: torch.nn.Module, names: dict[str, str], spec: MegatronModelSpec, tp: int, config: Any
) -> None:
    """Overwrite the stage's weights with the layout-independent draw (norms and biases kept)."""
    # Megatron draws weights in construction order from one generator, so a stage's layers
    # would get different values at each PP size; a seed per (model seed, TP=1 PP=1 name)
    # makes the draw independent of the layout. Norms (ones) and biases (zeros) keep theirs.
    rank = megatron_module("megatron.core.parallel_state").get_tensor_model_parallel_rank()
    for name, p in model.named_parameters():
        global_name = names[name]
        if name.endswith(".bias") or "layernorm" in name:
            continue
        init = config.output_layer_init_method if name.endswith(_OUTPUT_PROJECTIONS) else None
        shape = list(p.shape)
        split = bool(getattr(p, "tensor_model_parallel", False))
        dim = int(getattr(p, "partition_dim", 0))
        if split:
            if int(getattr(p, "partition_stride", 1)) != 1:
                raise InvalidConfigError(f"{name} is split with a stride, which gyre does not draw")
            shape[dim] *= tp
        torch.manual_seed(spec.seed * 1_000_003 + zlib.crc32(global_name.encode()))
        full = torch.empty(shape, dtype=torch.float32)
        (init or config.init_method)(full)
        if split:
            full = full.chunk(tp, dim=dim)[rank]
        p.copy_(full)


def split_full(full: torch.Tensor, parameter: torch.nn.Parameter, tp: int, rank: int) -> torch.Tensor:
    """This tensor-parallel rank's shard of a TP=1 tensor, split as Megatron splits `parameter`.

    A split with stride s (SwiGLU's fc1: [gate; up], stride 2) gives each rank the rank-th
    piece of each of the s blocks: [gate_r; up_r].
    """
    if tp == 1 or not getattr(parameter, "tensor_model_parallel", False):
        return full
    dim = int(getattr(parameter, "partition_dim", 0))
    stride = int(getattr(parameter, "partition_stride", 1))
    return torch.cat([block.chunk(tp, dim=dim)[rank] for block in full.chunk(stride, dim=dim)], dim=dim)


def join_shards(parts: list[torch.Tensor], parameter: torch.nn.Parameter) -> torch.Tensor:
    """The TP=1 tensor of every rank's shard (in rank order): `split_full` undone."""
    if len(parts) == 1 or not getattr(parameter, "tensor_model_parallel", False):
        return parts[0]
    dim = int(getattr(parameter, "partition_dim", 0))
    stride = int(getattr(parameter, "partition_stride", 1))
    pieces = [part.chunk(stride, dim=dim) for part in parts]  # [rank][block]
    return torch.cat([pieces[r][b] for b in range(stride) for r in range(len(parts))], dim=dim)


@torch.no_grad()
def load_weights(
    model: torch.nn.Module, names: dict[str, str], full: Mapping[str, torch.Tensor], tp: int
) -> None:
    """Copy a TP=1, PP=1 state (by `global_names`) into this stage's shard; every parameter
    must be there with its full shape."""
    rank = megatron_module("megatron.core.parallel_state").get_tensor_model_parallel_rank()
    for name, p in model.named_parameters():
        global_name = names[name]
        if global_name not in full:
            raise InvalidConfigError(f"the checkpoint gives no weight for {global_name}")
        shard = split_full(full[global_name], p, tp, rank)
        if shard.shape != p.shape:
            raise InvalidConfigError(
                f"{global_name}: the checkpoint's shard is {tuple(shard.shape)}, the model's {tuple(p.shape)}"
            )
        p.copy_(shard)


def stage_inputs(step: MicroStep) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[1, T] token ids, [1, T] position ids and the [1, 1, T, T] blocked-attention mask."""
    input_ids = torch.tensor(step.token_ids, dtype=torch.long)[None]
    position_ids = torch.tensor(step.position_ids, dtype=torch.long)[None]
    return input_ids, position_ids, blocked_attention(step)


def packed_logprobs(
    logits: torch.Tensor, input_ids: torch.Tensor, position_ids: torch.Tensor
) -> torch.Tensor:
    """[T] logprob of each token given the ones before it in its row; 0 at each row's start."""
    vocab_parallel_cross_entropy = megatron_module(
        "megatron.core.tensor_parallel"
    ).vocab_parallel_cross_entropy
    # Megatron's cross entropy is -log softmax at the target, reduced over the vocab shards.
    predicted = -vocab_parallel_cross_entropy(logits[:, :-1].float(), input_ids[:, 1:])[0]  # [T-1]
    logprobs = torch.cat([predicted.new_zeros(1), predicted])  # [T]
    # A row's first token would be "predicted" by the previous row's last one.
    return logprobs.masked_fill(position_ids[0] == 0, 0.0)


def blocked_attention(step: MicroStep) -> torch.Tensor:
    """[1, 1, T, T] bool, True where query i must NOT see key j (another row, or j > i)."""
    lengths = torch.tensor(step.row_starts[1:] - step.row_starts[:-1], dtype=torch.long)  # [R]
    segment = torch.repeat_interleave(torch.arange(lengths.shape[0]), lengths)  # [T]
    index = torch.arange(segment.shape[0])
    allowed = (segment[:, None] == segment[None, :]) & (index[None, :] <= index[:, None])  # [T, T]
    return (~allowed)[None, None]
