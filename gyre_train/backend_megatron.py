"""The Megatron-core training backend: a GPTModel split by tensor parallelism over a gloo group.

Every rank of the tensor-parallel group holds one shard, runs the same micro-steps and sees the
same logprobs (the vocab-parallel cross entropy reduces over the group). The flat vectors of the
`TrainingBackend` protocol are this rank's shard; `full_named_tensors` reassembles the TP=1
layout. The caller owns `torch.distributed` (initialised before entering the backend); data
parallel reduction across cells stays in cells.py. On a machine without a GPU the backend runs
inside `megatron_compat.cpu_megatron()` for its whole lifetime. Pipeline parallelism is not here.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
import torch.distributed as dist

from gyre_train.backend_torch import (
    LossOfLogprobs,
    OptimizerConfig,
    backward_loss,
    flatten_gradients,
    flatten_parameters,
    load_flat_parameters,
    make_optimizer,
)
from gyre_train.exceptions import InvalidConfigError
from gyre_train.megatron_compat import cpu_megatron, megatron_module
from gyre_train.packing import MicroStep

# Megatron-core's name for the RNG stream that tensor-parallel regions fork.
_MODEL_PARALLEL_RNG = "model-parallel-rng"


@dataclass(frozen=True, slots=True)
class MegatronModelSpec:
    """A small GPT (learned absolute positions, untied output layer) and the seed of its weights.

    Positions are learned embeddings because they take the packed position ids directly (they
    restart at 0 on every row); the weights are drawn on the CPU at full size and then split, so
    every tensor-parallel size starts from the same model.
    """

    num_layers: int = 2
    hidden_size: int = 64
    num_attention_heads: int = 4
    vocab_size: int = 512
    max_sequence_length: int = 128
    ffn_hidden_size: int | None = None
    seed: int = 0
    torch_threads: int = 1

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise InvalidConfigError("hidden_size must be a multiple of num_attention_heads")


@dataclass(eq=False)
class MegatronBackend:
    """One tensor-parallel shard of `spec`'s GPT; use as a context manager on every rank.

    Entering initialises Megatron's parallel state over the current `torch.distributed` world
    (whose size must be a multiple of `tensor_parallel_size`) and builds the model; leaving tears
    the parallel state down and undoes the CPU patches.
    """

    spec: MegatronModelSpec
    optimizer_config: OptimizerConfig = field(default_factory=OptimizerConfig)
    tensor_parallel_size: int = 1
    model: torch.nn.Module = field(init=False)
    _stack: ExitStack = field(init=False, default_factory=ExitStack)
    _optimizer: torch.optim.Optimizer | None = field(init=False, default=None)
    _params: list[torch.nn.Parameter] = field(init=False, default_factory=list)

    def __enter__(self) -> MegatronBackend:
        if not dist.is_initialized():
            raise InvalidConfigError("initialise torch.distributed before entering a MegatronBackend")
        if dist.get_world_size() % self.tensor_parallel_size:
            raise InvalidConfigError(
                f"world size {dist.get_world_size()} is not a multiple of TP={self.tensor_parallel_size}"
            )
        torch.set_num_threads(self.spec.torch_threads)
        with ExitStack() as stack:
            stack.enter_context(cpu_megatron())
            self._build(stack)
            self._stack = stack.pop_all()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stack.close()

    def _build(self, stack: ExitStack) -> None:
        parallel_state = megatron_module("megatron.core.parallel_state")
        tensor_parallel = megatron_module("megatron.core.tensor_parallel")
        gpt = megatron_module("megatron.core.models.gpt")
        layer_specs = megatron_module("megatron.core.models.gpt.gpt_layer_specs")
        transformer_config = megatron_module("megatron.core.transformer.transformer_config")

        parallel_state.initialize_model_parallel(tensor_model_parallel_size=self.tensor_parallel_size)
        stack.callback(parallel_state.destroy_model_parallel)
        tracker = tensor_parallel.get_cuda_rng_tracker()
        tracker.reset()
        tracker.add(_MODEL_PARALLEL_RNG, self.spec.seed + 2718)
        config = transformer_config.TransformerConfig(
            num_layers=self.spec.num_layers,
            hidden_size=self.spec.hidden_size,
            num_attention_heads=self.spec.num_attention_heads,
            ffn_hidden_size=self.spec.ffn_hidden_size,
            tensor_model_parallel_size=self.tensor_parallel_size,
            use_cpu_initialization=True,
            params_dtype=torch.float32,
            hidden_dropout=0.0,
            attention_dropout=0.0,
        )
        torch.manual_seed(self.spec.seed)
        self.model = gpt.GPTModel(
            config=config,
            transformer_layer_spec=layer_specs.get_gpt_layer_local_spec(),
            vocab_size=self.spec.vocab_size,
            max_sequence_length=self.spec.max_sequence_length,
            position_embedding_type="learned_absolute",
            share_embeddings_and_output_weights=False,
            parallel_output=True,
        )
        self.model.train()
        self._params = [p for p in self.model.parameters() if p.requires_grad]

    @property
    def _group(self) -> Any:
        return megatron_module("megatron.core.parallel_state").get_tensor_model_parallel_group()

    @property
    def numel(self) -> int:
        """Values in this rank's shard."""
        return sum(p.numel() for p in self._params)

    def logprobs(self, step: MicroStep, *, grad: bool) -> torch.Tensor:
        """[T] packed logprobs (0 at each row's first token), identical on every TP rank."""
        vocab_parallel_cross_entropy = megatron_module(
            "megatron.core.tensor_parallel"
        ).vocab_parallel_cross_entropy
        total = len(step)
        if total == 0:
            return torch.zeros(0, dtype=torch.float32)
        if total > self.spec.max_sequence_length:
            raise InvalidConfigError(
                f"micro-step has {total} tokens, max_sequence_length is {self.spec.max_sequence_length}"
            )
        input_ids = torch.tensor(step.token_ids, dtype=torch.long)[None]  # [1, T]
        position_ids = torch.tensor(step.position_ids, dtype=torch.long)[None]  # [1, T]
        with torch.set_grad_enabled(grad):
            logits = self.model(input_ids, position_ids, _blocked_attention(step))  # [1, T, V/tp]
            # Megatron's cross entropy is -log softmax at the target, reduced over the vocab shards.
            predicted = -vocab_parallel_cross_entropy(logits[:, :-1].float(), input_ids[:, 1:])[0]  # [T-1]
            logprobs = torch.cat([predicted.new_zeros(1), predicted])  # [T]
            # A row's first token would be "predicted" by the previous row's last one.
            return logprobs.masked_fill(position_ids[0] == 0, 0.0)

    def accumulate_gradients(self, step: MicroStep, loss_of: LossOfLogprobs) -> float:
        return backward_loss(loss_of(self.logprobs(step, grad=True)))

    def flat_parameters(self) -> torch.Tensor:
        return flatten_parameters(self._params)

    def load_flat_parameters(self, flat: torch.Tensor) -> None:
        load_flat_parameters(self._params, flat, "shard")

    def flat_gradients(self) -> torch.Tensor:
        return flatten_gradients(self._params)

    def zero_gradients(self) -> None:
        for p in self._params:
            p.grad = None

    def _make_optimizer(self) -> torch.optim.Optimizer:
        return make_optimizer(self._params, self.optimizer_config)

    def _global_norm(self, gradients: list[torch.Tensor]) -> float:
        """The L2 norm of the whole model's gradient: shards summed over the group, copies once."""
        is_not_duplicate = megatron_module(
            "megatron.core.tensor_parallel"
        ).param_is_not_tensor_parallel_duplicate
        squares = torch.zeros((), dtype=torch.float64)
        for p, g in zip(self._params, gradients, strict=True):
            if is_not_duplicate(p):
                squares += g.double().square().sum()
        dist.all_reduce(squares, group=self._group)
        return float(squares.sqrt())

    def apply_update(self, flat_gradients: torch.Tensor) -> float:
        """Clip this shard's batch gradient by the global norm, step, and return that norm.

        Every rank must call it together (the norm is reduced over the tensor-parallel group).
        """
        if self._optimizer is None:
            self._optimizer = self._make_optimizer()
        gradients = []
        offset = 0
        for p in self._params:
            gradients.append(flat_gradients[offset : offset + p.numel()].view_as(p).clone())
            offset += p.numel()
        norm = self._global_norm(gradients)
        max_norm = self.optimizer_config.max_grad_norm
        # The same scale as clip_grad_norm_: max_norm / (norm + 1e-6), only when it is below 1.
        scale = min(1.0, max_norm / (norm + 1e-6)) if max_norm > 0 else 1.0
        for p, g in zip(self._params, gradients, strict=True):
            p.grad = g.mul_(scale) if scale < 1.0 else g
        self._optimizer.step()
        self.zero_gradients()
        return norm

    def named_tensors(self) -> dict[str, torch.Tensor]:
        """This rank's shard, by Megatron parameter name."""
        return {name: p.detach() for name, p in self.model.named_parameters()}

    def full_named_tensors(self) -> dict[str, torch.Tensor]:
        """Every parameter in its TP=1 layout (shards gathered along their partition dimension).

        Collective: every rank of the group must call it; every rank gets the full tensors.
        """
        return {name: self._gathered(p, p.detach()) for name, p in self.model.named_parameters()}

    def full_named_gradients(self) -> dict[str, torch.Tensor]:
        """The accumulated gradients in the TP=1 layout (collective, like `full_named_tensors`)."""
        return {
            name: self._gathered(p, p.grad.detach() if p.grad is not None else torch.zeros_like(p))
            for name, p in self.model.named_parameters()
        }

    def _gathered(self, parameter: torch.nn.Parameter, shard: torch.Tensor) -> torch.Tensor:
        # Megatron marks split parameters with `tensor_model_parallel` and `partition_dim`; the
        # rest (norms, row-parallel biases) are identical copies on every rank.
        size = self.tensor_parallel_size
        if size == 1 or not getattr(parameter, "tensor_model_parallel", False):
            return shard.clone()
        parts = [torch.empty_like(shard) for _ in range(size)]
        dist.all_gather(parts, shard.contiguous(), group=self._group)
        return torch.cat(parts, dim=int(getattr(parameter, "partition_dim", 0)))

    def save(self, path: Path) -> Path:
        """This rank's shard as `tp<rank>.pt` under `path`."""
        path.mkdir(parents=True, exist_ok=True)
        rank = megatron_module("megatron.core.parallel_state").get_tensor_model_parallel_rank()
        target = path / f"tp{rank}.pt"
        torch.save(self.named_tensors(), target)
        return target


def _blocked_attention(step: MicroStep) -> torch.Tensor:
    """[1, 1, T, T] bool, True where query i must NOT see key j (another row, or j > i)."""
    lengths = torch.tensor(step.row_starts[1:] - step.row_starts[:-1], dtype=torch.long)  # [R]
    segment = torch.repeat_interleave(torch.arange(lengths.shape[0]), lengths)  # [T]
    index = torch.arange(segment.shape[0])
    allowed = (segment[:, None] == segment[None, :]) & (index[None, :] <= index[:, None])  # [T, T]
    return (~allowed)[None, None]
