"""The Megatron-core training backend: a GPTModel split by tensor and pipeline parallelism.

(The model itself is built in megatron_model.py.)

Each rank holds one TP shard of one pipeline stage; with PP > 1 a micro-step goes through
Megatron's 1F1B schedule and the last stage broadcasts its logprobs and loss, so the
`TrainingBackend` protocol holds on every rank. Flat vectors are this rank's shard;
`full_named_tensors` is the TP=1, PP=1 model. Optionally Megatron's distributed optimizer shards
AdamW's state over the data-parallel ranks. The caller owns `torch.distributed` and the reduction
across cells (gyre_train.cells); without a GPU everything runs inside `megatron_cpu.cpu_megatron()`.
The model is the seeded GPT or a Qwen3 checkpoint's (megatron_qwen3.py; tied embeddings only with
PP = 1). Not here: virtual pipeline stages, expert parallelism.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, cast

import torch
import torch.distributed as dist

from gyre_train.backends.megatron_cpu import cpu_megatron, megatron_module
from gyre_train.backends.megatron_model import (
    MegatronModelSpec,
    build_stage,
    draw_weights,
    global_names,
    join_shards,
    load_weights,
    packed_logprobs,
    stage_inputs,
)
from gyre_train.backends.megatron_qwen3 import megatron_state, read_weights
from gyre_train.backends.pytorch import (
    LossOfLogprobs,
    OptimizerConfig,
    backward_loss,
    flatten_gradients,
    flatten_parameters,
    load_flat_parameters,
    make_optimizer,
)
from gyre_train.exceptions import InvalidConfigError
from gyre_train.trajectories import MicroStep


@dataclass(eq=False)
class MegatronBackend:
    """One shard of one stage of `spec`'s GPT; use as a context manager on every rank.

    Entering initialises Megatron's parallel state over the current `torch.distributed` world
    (whose size must be a multiple of TP * PP; the rest is data parallel) and builds this rank's
    stage; leaving tears the parallel state down and undoes the CPU patches.

    `distributed_optimizer` wraps the stage in Megatron's DistributedDataParallel and steps
    Megatron's sharded AdamW (SGD is refused: Megatron shards only Adam); every data-parallel rank
    then calls `apply_update` with the same summed gradient. Unlike gyre's plain AdamW it skips
    weight decay on biases and norms.
    """

    spec: MegatronModelSpec
    optimizer_config: OptimizerConfig = field(default_factory=OptimizerConfig)
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    distributed_optimizer: bool = False
    model: torch.nn.Module = field(init=False)
    _stack: ExitStack = field(init=False, default_factory=ExitStack)
    # Megatron's DistributedDataParallel around `model` (only with the distributed optimizer).
    _ddp: Any = field(init=False, default=None)
    # torch.optim.Optimizer, or Megatron's (sharded) optimizer with the distributed optimizer.
    _optimizer: Any = field(init=False, default=None)
    _params: list[torch.nn.Parameter] = field(init=False, default_factory=list)
    _global_names: dict[str, str] = field(init=False, default_factory=dict)

    def __enter__(self) -> MegatronBackend:
        if not dist.is_initialized():
            raise InvalidConfigError("initialise torch.distributed before entering a MegatronBackend")
        if self.tensor_parallel_size < 1 or self.pipeline_parallel_size < 1:
            raise InvalidConfigError("tensor_parallel_size and pipeline_parallel_size must be >= 1")
        model_parallel = self.tensor_parallel_size * self.pipeline_parallel_size
        if dist.get_world_size() % model_parallel:
            raise InvalidConfigError(
                f"world size {dist.get_world_size()} is not a multiple of "
                f"TP={self.tensor_parallel_size} x PP={self.pipeline_parallel_size}"
            )
        if self.spec.num_layers % self.pipeline_parallel_size:
            raise InvalidConfigError(
                f"{self.spec.num_layers} layers do not split into {self.pipeline_parallel_size} stages"
            )
        if self.distributed_optimizer and self.optimizer_config.kind != "adamw":
            raise InvalidConfigError(
                f"Megatron's distributed optimizer only runs AdamW, not {self.optimizer_config.kind!r}"
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

    # -- construction ------------------------------------------------------------------------

    def _build(self, stack: ExitStack) -> None:
        self.model, config = build_stage(
            self.spec, self.tensor_parallel_size, self.pipeline_parallel_size, stack
        )
        self._params = [p for p in self.model.parameters() if p.requires_grad]
        self._global_names = global_names(self.model)
        if self.spec.checkpoint is not None:
            full = megatron_state(self.spec, read_weights(self.spec.checkpoint))
            load_weights(self.model, self._global_names, full, self.tensor_parallel_size)
        else:
            draw_weights(self.model, self._global_names, self.spec, self.tensor_parallel_size, config)
        if self.tensor_parallel_size > 1:
            self._sum_norm_gradients_over_tp()
        if self.distributed_optimizer:
            self._wrap_for_distributed_optimizer(config)

    def _sum_norm_gradients_over_tp(self) -> None:
        """Each TP rank holds its own heads, so its copy of a per-head query or key norm weight
        gets the gradient of those heads only: every backward's contribution is summed over the
        tensor-parallel group before it accumulates (what Megatron's finalize_model_grads does
        for qk_layernorm after the whole backward)."""

        def summed(gradient: torch.Tensor) -> torch.Tensor:
            total = gradient.clone()
            dist.all_reduce(total, group=self._group)
            return total

        for name, p in self.model.named_parameters():
            if "q_layernorm" in name or "k_layernorm" in name:
                p.register_hook(summed)  # type: ignore[no-untyped-call]

    def _wrap_for_distributed_optimizer(self, config: Any) -> None:
        # DDP moves the parameters into one contiguous buffer and accumulates every backward
        # into `main_grad` views of a matching gradient buffer; the distributed optimizer owns a
        # 1/DP slice of both. It never reduces here: gradients arrive summed in `apply_update`.
        distributed = megatron_module("megatron.core.distributed")
        ddp_config = distributed.DistributedDataParallelConfig(
            use_distributed_optimizer=True,
            grad_reduce_in_fp32=True,
            overlap_grad_reduce=False,
            overlap_param_gather=False,
        )
        self._ddp = distributed.DistributedDataParallel(config, ddp_config, self.model)

    # -- groups ------------------------------------------------------------------------------

    @property
    def _group(self) -> Any:
        return megatron_module("megatron.core.parallel_state").get_tensor_model_parallel_group()

    @property
    def _pipelined(self) -> bool:
        return self.pipeline_parallel_size > 1

    @property
    def _module(self) -> torch.nn.Module:
        """What the forward runs through: the DDP wrapper when there is one."""
        return self.model if self._ddp is None else cast(torch.nn.Module, self._ddp)

    def _gradient_of(self, p: torch.nn.Parameter) -> torch.Tensor:
        """The accumulated gradient of `p`: DDP's `main_grad` view, else `.grad` (or zeros)."""
        if self._ddp is not None:
            return cast(torch.Tensor, getattr(p, "main_grad"))  # noqa: B009 (set by Megatron's DDP)
        return p.grad if p.grad is not None else torch.zeros_like(p)

    @property
    def numel(self) -> int:
        """Values in this rank's shard."""
        return sum(p.numel() for p in self._params)

    # -- the two passes ----------------------------------------------------------------------

    def logprobs(self, step: MicroStep, *, grad: bool) -> torch.Tensor:
        """[T] packed logprobs (0 at each row's first token), identical on every rank.

        With pipeline parallelism the graph spans processes, so only `grad=False` is offered
        (pass 2 goes through `accumulate_gradients`); it raises InvalidConfigError otherwise.
        """
        total = self._check_length(step)
        if total == 0:
            return torch.zeros(0, dtype=torch.float32)
        if self._pipelined:
            if grad:
                raise InvalidConfigError(
                    "a pipeline-parallel backend keeps no graph across stages: call "
                    "accumulate_gradients for pass 2"
                )
            with torch.no_grad():
                return self._through_pipeline(step, None)[0]
        input_ids, position_ids, mask = stage_inputs(step)
        with torch.set_grad_enabled(grad):
            logits = self._module(input_ids, position_ids, mask)  # [1, T, V/tp]
            return packed_logprobs(logits, input_ids, position_ids)

    def accumulate_gradients(self, step: MicroStep, loss_of: LossOfLogprobs) -> float:
        if not self._pipelined:
            return backward_loss(loss_of(self.logprobs(step, grad=True)))
        if self._check_length(step) == 0:
            return float(loss_of(torch.zeros(0, dtype=torch.float32)))
        return self._through_pipeline(step, loss_of)[1]

    def _check_length(self, step: MicroStep) -> int:
        total = len(step)
        if total > self.spec.max_sequence_length:
            raise InvalidConfigError(
                f"micro-step has {total} tokens, max_sequence_length is {self.spec.max_sequence_length}"
            )
        return total

    def _through_pipeline(
        self, step: MicroStep, loss_of: LossOfLogprobs | None
    ) -> tuple[torch.Tensor, float]:
        """One micro-step through the 1F1B schedule (forward only without `loss_of`).

        The last stage computes the logprobs and `loss_of` on them; both are broadcast to every
        stage, so every rank returns the same ([T] logprobs, loss value).
        """
        parallel_state = megatron_module("megatron.core.parallel_state")
        schedules = megatron_module("megatron.core.pipeline_parallel.schedules")
        input_ids, position_ids, mask = stage_inputs(step)
        total = len(step)
        seen: dict[str, Any] = {}

        def loss_func(logits: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
            logprobs = packed_logprobs(logits, input_ids, position_ids)  # [T]
            seen["logprobs"] = logprobs.detach()
            loss = loss_of(logprobs) if loss_of is not None else logprobs.new_zeros(())
            seen["loss"] = float(loss.detach())
            # The schedule scales what it is given in place (by 1 / micro-batches): hand it a copy.
            return loss.clone(), {}

        def forward_step(data: Any, model: torch.nn.Module) -> tuple[torch.Tensor, Any]:
            return model(input_ids, position_ids, mask), loss_func

        schedules.get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter([None]),
            model=[self._module],
            num_microbatches=1,
            seq_length=total,
            micro_batch_size=1,
            forward_only=loss_of is None,
        )
        result = torch.zeros(total + 1, dtype=torch.float64)  # [T logprobs, loss]
        if parallel_state.is_pipeline_last_stage():
            result[:total] = seen["logprobs"]
            result[total] = seen["loss"]
        dist.broadcast(
            result,
            src=parallel_state.get_pipeline_model_parallel_last_rank(),
            group=parallel_state.get_pipeline_model_parallel_group(),
        )
        return result[:total].float(), float(result[total])

    # -- flat vectors and the update ---------------------------------------------------------

    def flat_parameters(self) -> torch.Tensor:
        return flatten_parameters(self._params)

    def load_flat_parameters(self, flat: torch.Tensor) -> None:
        load_flat_parameters(self._params, flat, "shard")

    def flat_gradients(self) -> torch.Tensor:
        if self._ddp is None:
            return flatten_gradients(self._params)
        return torch.cat([self._gradient_of(p).detach().reshape(-1).float() for p in self._params])

    def zero_gradients(self) -> None:
        if self._ddp is not None:
            self._ddp.zero_grad_buffer()
        for p in self._params:
            p.grad = None

    def _make_optimizer(self) -> Any:
        if self._ddp is None:
            optimizer = make_optimizer(self._params, self.optimizer_config)
            path = self.optimizer_config.state_path
            if path is not None:
                optimizer.load_state_dict(self._kept_state(Path(path)))
            return optimizer
        if self.optimizer_config.state_path is not None:
            raise InvalidConfigError("the distributed optimizer does not resume from a kept state")
        optimizer = megatron_module("megatron.core.optimizer")
        ours = self.optimizer_config
        # Megatron skips weight decay on biases and norms; gyre's plain optimizer does not.
        config = optimizer.OptimizerConfig(
            optimizer="adam",
            lr=ours.lr,
            min_lr=ours.lr,
            weight_decay=ours.weight_decay,
            adam_beta1=ours.betas[0],
            adam_beta2=ours.betas[1],
            adam_eps=1e-8,  # torch's AdamW default, as make_optimizer uses
            clip_grad=ours.max_grad_norm,
            use_distributed_optimizer=True,
            params_dtype=torch.float32,
        )
        return optimizer.get_megatron_optimizer(config, [self._ddp])

    def _layout_key(self) -> str:
        parallel_state = megatron_module("megatron.core.parallel_state")
        tp = parallel_state.get_tensor_model_parallel_rank()
        pp = parallel_state.get_pipeline_model_parallel_rank()
        return f"tp{tp}-pp{pp}"

    def _kept_state(self, path: Path) -> Any:
        """This rank's optimizer state out of a file of `gathered_training_state`."""
        if not path.is_file():
            raise InvalidConfigError(f"no optimizer state at {path}")
        kept = torch.load(path, weights_only=True)
        shards = kept.get("megatron") if isinstance(kept, dict) else None
        key = self._layout_key()
        layout = (self.tensor_parallel_size, self.pipeline_parallel_size)
        if not isinstance(shards, dict) or key not in shards or kept.get("layout") != list(layout):
            raise InvalidConfigError(
                f"{path} holds no Megatron optimizer state for shard {key} of TP={layout[0]}, "
                f"PP={layout[1]} (a kept state is not resharded)"
            )
        return shards[key]

    def gathered_training_state(self) -> dict[str, Any] | None:
        """Every shard's optimizer state on every rank (collective over the model-parallel
        group): `{"megatron": {"tp<t>-pp<p>": state_dict}, "layout": [TP, PP]}`; None before
        any update or kept state. A core resumed with the same TP and PP takes its shard's back
        (`state_path`)."""
        if self._ddp is not None:
            raise InvalidConfigError("the distributed optimizer's state is not kept with a publication")
        if self._optimizer is None and self.optimizer_config.state_path is None:
            return None
        if self._optimizer is None:
            self._optimizer = self._make_optimizer()
        group = megatron_module("megatron.core.parallel_state").get_model_parallel_group()
        mine = (self._layout_key(), self._optimizer.state_dict())
        parts: list[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(parts, mine, group=group)
        return {"megatron": dict(parts), "layout": [self.tensor_parallel_size, self.pipeline_parallel_size]}

    def optimizer_state_numel(self) -> int:
        """Values of optimizer state (moments) this rank holds; 0 before the first update."""
        if self._optimizer is None:
            return 0
        inner = getattr(self._optimizer, "chained_optimizers", [self._optimizer])
        torch_optimizers = [getattr(o, "optimizer", o) for o in inner]
        return sum(
            value.numel()
            for o in torch_optimizers
            for state in o.state.values()
            for key, value in state.items()
            if key != "step" and isinstance(value, torch.Tensor)
        )

    def _global_norm(self, gradients: list[torch.Tensor]) -> float:
        """The L2 norm of the whole model's gradient: shards summed over TP and PP, copies once.

        Each stage holds different parameters (the embedding and output layer are untied), and
        within a stage `param_is_not_tensor_parallel_duplicate` picks one copy of what TP repeats.
        """
        parallel_state = megatron_module("megatron.core.parallel_state")
        is_not_duplicate = megatron_module(
            "megatron.core.tensor_parallel"
        ).param_is_not_tensor_parallel_duplicate
        squares = torch.zeros((), dtype=torch.float64)
        for p, g in zip(self._params, gradients, strict=True):
            if is_not_duplicate(p):
                squares += g.double().square().sum()
        dist.all_reduce(squares, group=parallel_state.get_model_parallel_group())
        return float(squares.sqrt())

    def apply_update(self, flat_gradients: torch.Tensor) -> float:
        """Clip this shard's batch gradient by the global norm, step, and return that norm.

        Every rank of the model-parallel group must call it together (the norm is reduced over
        TP and PP); with the distributed optimizer every data-parallel rank too, each with the
        same summed gradient: each steps its slice and the parameters are all-gathered.
        """
        if self._optimizer is None:
            self._optimizer = self._make_optimizer()
        if self._ddp is not None:
            return self._apply_distributed(flat_gradients)
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

    def _apply_distributed(self, flat_gradients: torch.Tensor) -> float:
        """Write the batch gradient into DDP's `main_grad` buffers and step Megatron's optimizer.

        Its step copies this rank's slice of the buffers into the shard's `.grad`, clips by the
        norm over every slice (data and model parallel), steps the slice's AdamW and all-gathers
        the parameters over the data-parallel group.
        """
        if flat_gradients.numel() != self.numel:
            raise InvalidConfigError(
                f"flat gradients have {flat_gradients.numel()} values, the shard {self.numel}"
            )
        offset = 0
        with torch.no_grad():
            for p in self._params:
                self._gradient_of(p).copy_(flat_gradients[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
        unclipped = self.optimizer_config.max_grad_norm <= 0
        # Megatron reports the norm only when it clips (then it is this same global norm).
        norm = self._global_norm([self._gradient_of(p) for p in self._params]) if unclipped else 0.0
        succeeded, megatron_norm, _ = self._optimizer.step()
        assert succeeded  # only a loss scaler (fp16) can skip a step, and there is none
        self.zero_gradients()
        return norm if unclipped else float(megatron_norm)

    # -- whole-model views -------------------------------------------------------------------

    def named_tensors(self) -> dict[str, torch.Tensor]:
        """This rank's shard, by Megatron parameter name (layer numbers local to the stage)."""
        return {name: p.detach() for name, p in self.model.named_parameters()}

    def full_named_tensors(self) -> dict[str, torch.Tensor]:
        """Every parameter in the TP=1, PP=1 layout and names, in that model's order.

        Collective over the model-parallel group: every rank gets the whole model.
        """
        return self._whole({name: p.detach() for name, p in self.model.named_parameters()})

    def full_named_gradients(self) -> dict[str, torch.Tensor]:
        """The accumulated gradients in the TP=1, PP=1 layout (collective, like the tensors)."""
        return self._whole(
            {name: self._gradient_of(p).detach().float() for name, p in self.model.named_parameters()}
        )

    def full_named_of(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """A flat vector laid out like this shard's parameters (a reduced batch gradient, say) in
        the TP=1, PP=1 layout and names (collective, like the tensors)."""
        if flat.numel() != self.numel:
            raise InvalidConfigError(f"flat vector has {flat.numel()} values, the shard {self.numel}")
        shards: dict[str, torch.Tensor] = {}
        offset = 0
        for name, p in self.model.named_parameters():
            if p.requires_grad:
                shards[name] = flat[offset : offset + p.numel()].view_as(p)
                offset += p.numel()
        return self._whole(shards)

    def _whole(self, shards: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        parameters = dict(self.model.named_parameters())
        stage = {self._global_names[n]: self._gathered(parameters[n], t) for n, t in shards.items()}
        if not self._pipelined:
            return stage
        parallel_state = megatron_module("megatron.core.parallel_state")
        stages: list[dict[str, torch.Tensor] | None] = [None] * self.pipeline_parallel_size
        dist.all_gather_object(stages, stage, group=parallel_state.get_pipeline_model_parallel_group())
        return {name: t for part in stages if part is not None for name, t in part.items()}

    def _gathered(self, parameter: torch.nn.Parameter, shard: torch.Tensor) -> torch.Tensor:
        # Megatron marks split parameters with `tensor_model_parallel` and `partition_dim`; the
        # rest (norms, row-parallel biases) are identical copies on every rank.
        size = self.tensor_parallel_size
        if size == 1 or not getattr(parameter, "tensor_model_parallel", False):
            return shard.clone()
        parts = [torch.empty_like(shard) for _ in range(size)]
        dist.all_gather(parts, shard.contiguous(), group=self._group)
        return join_shards(parts, parameter)

    def save(self, path: Path) -> Path:
        """This rank's shard as `tp<t>-pp<p>.pt` under `path` (names as `named_tensors`)."""
        parallel_state = megatron_module("megatron.core.parallel_state")
        path.mkdir(parents=True, exist_ok=True)
        tp = parallel_state.get_tensor_model_parallel_rank()
        pp = parallel_state.get_pipeline_model_parallel_rank()
        target = path / f"tp{tp}-pp{pp}.pt"
        torch.save(self.named_tensors(), target)
        return target


__all__ = ["MegatronBackend", "MegatronModelSpec"]
