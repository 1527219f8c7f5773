"""The PyTorch backend sharded by FSDP2 over a cell's ranks: one replica, 1/N of it per rank.

Every rank of the cell runs the same micro-step (the leader's command, replica.py); each decoder
layer and the rest of the model are `fully_shard` units over the cell's group, so a rank holds a
1/N shard of the weights, of the gradients (reduce-scattered after each backward, averaged over
N identical replicas of one micro-step) and of the optimizer's moments, and all-gathers one
layer at a time to compute. The flat vectors a cell moves (`flat_parameters`, `flat_gradients`)
are this rank's shards, so position p of every cell meets the same shard in the cross-cell
reduction and broadcast. The embeddings and an untied linear output head are split by
vocabulary rows instead (`_vocabulary_parallel`: each rank looks up and scores against its own
rows and the cell sums the pieces), so their whole weights and gradients never exist on a rank;
the root unit keeps the rest (the final norm). A micro-step of several rows is back-propagated
row by row (`FsdpBackend.accumulate_gradients`), so each layer's gradient is reduce-scattered
after every row instead of held whole until the last. Buffers of 128 KiB or more are mapped on
their own (`fix_mmap_threshold`) and the heap is trimmed between passes (glibc). The
optimizer state a core keeps is gathered whole, in the unsharded layout.

A checkpoint folder in safetensors (``ModelSpec.model_dir``) is loaded shard by shard: the model
is built with its parameters on the meta device (no memory), sharded, given this rank's
shards' memory, and each tensor is read from the folder one at a time and cut to this rank's
shard, so no rank ever holds the whole model, only its largest tensor for a moment. A seeded
model (``ModelSpec.config``, the tests' and the demo's) and a folder without safetensors are
still built whole once per rank before they are sharded: a seeded model's weights are its
random generator's stream over the whole model.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import itertools
import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import torch.distributed as dist
from safetensors import safe_open
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from gyre_train.backends.pytorch import (
    LossOfLogprobs,
    ModelSpec,
    TorchBackend,
    build_model,
    checkpoint_folder,
    enable_activation_checkpointing,
    make_optimizer,
    read_whole,
    write_whole,
)
from gyre_train.exceptions import InvalidConfigError
from gyre_train.objective import packed_token_logprobs
from gyre_train.objective.logprobs import chunked_log_partition, subtract_softmax_terms
from gyre_train.trajectories import MicroStep


def _first_row(rows: int, group: Any) -> int:
    """The first vocabulary row of this rank's Shard(0) piece of a [rows, H] matrix
    (torch.chunk's split: ceil(rows / N) rows each, the last ones fewer)."""
    return min(dist.get_rank(group) * -(-rows // dist.get_world_size(group)), rows)


class _ShardedEmbedding(torch.autograd.Function):
    """An embedding lookup from this rank's rows of the table: each rank looks up the ids in its
    rows, zeros elsewhere, and the cell sums them (every id is in one rank's rows, so the sum is
    the lookup, exactly). Every rank runs the same micro-step and so receives the same output
    gradient: the backward is local, this rank's rows' gradient, with no communication."""

    @staticmethod
    def forward(
        ctx: Any, ids: torch.Tensor, local: torch.Tensor, start: int, padding: int | None, group: Any
    ) -> torch.Tensor:
        mine = (ids >= start) & (ids < start + local.shape[0])
        rows = torch.where(mine, ids - start, 0)
        out = torch.nn.functional.embedding(rows, local.float()) * mine.unsqueeze(-1)
        dist.all_reduce(out, group=group)
        keep = mine if padding is None else mine & (ids != padding)  # no gradient to padding
        ctx.save_for_backward(rows, keep)
        ctx.shape = local.shape
        return out.to(local.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, torch.Tensor, None, None, None]:
        rows, keep = ctx.saved_tensors
        local = grad.new_zeros(ctx.shape, dtype=torch.float32)
        local.index_add_(0, rows[keep], grad[keep].float())
        return None, local.to(grad.dtype), None, None, None


class _ShardedTargetLogprob(torch.autograd.Function):
    """log softmax(h W^T)[y] with W's rows split over the cell (`_TargetLogprob`, vocabulary
    parallel): each rank takes the log partition over its own rows, the cell combines them and
    the target's logit from the rank that holds it. In backward each rank's rows' gradient is
    its own; the hidden states' gradient is summed over the cell."""

    @staticmethod
    def forward(
        ctx: Any, hidden: torch.Tensor, local: torch.Tensor, targets: torch.Tensor, start: int, group: Any
    ) -> torch.Tensor:
        lse = chunked_log_partition(hidden, local)  # [U] over this rank's rows
        every = [torch.empty_like(lse) for _ in range(dist.get_world_size(group))]
        dist.all_gather(every, lse, group=group)
        lse = torch.logsumexp(torch.stack(every), dim=0)  # [U], the same on every rank
        mine = (targets >= start) & (targets < start + local.shape[0])
        rows = torch.where(mine, targets - start, 0)
        picked = (hidden * local[rows]).sum(-1) * mine
        dist.all_reduce(picked, group=group)
        ctx.save_for_backward(hidden, local, rows, mine, lse)
        ctx.group = group
        return picked - lse

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, None, None, None]:
        hidden, local, rows, mine, lse = ctx.saved_tensors
        g = grad[:, None]  # [U, 1]
        owned = g * mine[:, None]
        grad_hidden = owned * local[rows]
        grad_local = None
        if ctx.needs_input_grad[1]:
            grad_local = torch.zeros_like(local)
            grad_local.index_add_(0, rows[mine], (owned * hidden)[mine])
        grad_hidden = subtract_softmax_terms(g, hidden, local, lse, grad_hidden, grad_local)
        dist.all_reduce(grad_hidden, group=ctx.group)
        return grad_hidden, grad_local, None, None, None


class _VocabParallel:
    """What a vocabulary-parallel module knows of its cell: the group, the compute dtype."""

    group: Any
    compute: torch.dtype

    def _local(self) -> tuple[torch.Tensor, int]:
        weight = cast(DTensor, cast(Any, self).weight)
        local = weight.to_local()  # differentiable: the gradient arrives as this rank's shard
        return local.to(self.compute), _first_row(weight.shape[0], self.group)


class _ShardedEmbeddingModule(torch.nn.Embedding, _VocabParallel):
    """The input embeddings, vocabulary parallel: their weight is a Shard(0) DTensor outside
    every FSDP unit, never gathered (`_ShardedEmbedding`)."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local, start = self._local()
        out: torch.Tensor = _ShardedEmbedding.apply(ids, local, start, self.padding_idx, self.group)  # type: ignore[no-untyped-call]
        return out


class _ShardedHead(torch.nn.Linear, _VocabParallel):
    """The output head, vocabulary parallel: called with targets it computes the targets-only
    head's logprobs from this rank's rows of its weight (`_ShardedTargetLogprob`), never gathered,
    its gradient never whole. Without targets, the plain linear layer on the gathered weight."""

    def forward(self, hidden: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        if targets is None:
            return torch.nn.functional.linear(hidden, _full(self.weight).to(hidden.dtype))
        local, start = self._local()
        picked: torch.Tensor = _ShardedTargetLogprob.apply(
            hidden.float(), local.float(), targets, start, self.group
        )  # type: ignore[no-untyped-call]
        return picked


def _vocabulary_parallel_fits(embeddings: torch.nn.Module, head: torch.nn.Module | None) -> bool:
    """Whether the embeddings and the head can be split by vocabulary rows: a plain lookup table
    and an untied linear head without bias (Qwen, Llama and the like)."""
    return (
        type(embeddings) is torch.nn.Embedding
        and embeddings.max_norm is None
        and not embeddings.scale_grad_by_freq
        and not embeddings.sparse
        and type(head) is torch.nn.Linear
        and head.bias is None
        and head.weight is not embeddings.weight
    )


def _vocabulary_parallel(
    module: torch.nn.Module, kind: type[_VocabParallel], mesh: DeviceMesh, group: Any, compute: torch.dtype
) -> torch.nn.Parameter:
    """Make ``module`` (an Embedding or a Linear head) ``kind``: its weight becomes this rank's
    Shard(0) rows as a DTensor (no copy across ranks; on the meta device it stays there)."""
    weight = cast(torch.nn.Parameter, module.weight)
    sharded = distribute_tensor(weight.detach(), mesh, [Shard(0)], src_data_rank=None)
    module.weight = torch.nn.Parameter(sharded, requires_grad=weight.requires_grad)
    module.__class__ = cast(type, kind)
    vp = cast(_VocabParallel, module)
    vp.group, vp.compute = group, compute
    return module.weight


class _Logprobs(torch.nn.Module):
    """The root FSDP unit: its forward is the packed logprobs. Each decoder layer is a unit of
    its own, gathered only around its use; the embeddings and the head are vocabulary parallel
    (outside every unit) where they fit, else in the root with what is left (the final norm)."""

    def __init__(self, model: torch.nn.Module, head: torch.nn.Module | None) -> None:
        super().__init__()
        self.inner = model
        # a function, not a second child: the head is reached through `inner`
        self._head_call = None if head is None else lambda hidden, targets: head(hidden, targets)

    def forward(self, step: MicroStep) -> torch.Tensor:
        return packed_token_logprobs(self.inner, step, head=self._head_call).float()  # [T]


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or not len(layers):
        raise InvalidConfigError(f"{type(model).__name__} has no decoder layers (model.layers) to shard")
    return list(layers)


@functools.cache
def _glibc() -> Any:
    """glibc, loaded once; None where the C library is not glibc (its allocator calls are then
    skipped)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None


def _trim_heap() -> None:
    """Hand the heap's free pages back to the system (glibc's malloc_trim; elsewhere nothing):
    the layers FSDP gathers and frees on every pass are, once glibc has raised its mmap
    threshold, taken from the heap, which otherwise keeps what they freed."""
    if (libc := _glibc()) is not None:
        libc.malloc_trim(0)


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
FIXED_MMAP_THRESHOLD = 128 * 1024


def fix_mmap_threshold(environ: Mapping[str, str] | None = None) -> bool:
    """Map every buffer of 128 KiB or more on its own and hand back heap tops over 128 KiB
    (glibc's ``mallopt``; elsewhere nothing), unless the process was started with
    ``MALLOC_MMAP_THRESHOLD_`` set (its own choice stands). By default glibc raises its mmap
    threshold to the largest mapped buffer freed so far (up to 32 MiB), after which the layers
    FSDP gathers and frees on every pass are carved from the heap, which keeps what they freed.
    True when set."""
    environ = os.environ if environ is None else environ
    if "MALLOC_MMAP_THRESHOLD_" in environ:
        return False
    if (libc := _glibc()) is None:
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, FIXED_MMAP_THRESHOLD)) and bool(
        libc.mallopt(_M_TRIM_THRESHOLD, FIXED_MMAP_THRESHOLD)
    )


def checkpoint_tensor_files(model_dir: Path) -> dict[str, Path] | None:
    """Each tensor's safetensors file in a ``save_pretrained`` folder (one file, or several
    named by ``model.safetensors.index.json``); None when the folder holds no safetensors."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: model_dir / file for name, file in weight_map.items()}
    single = model_dir / "model.safetensors"
    if not single.is_file():
        return None
    with safe_open(str(single), framework="pt") as f:
        return {name: single for name in f.keys()}  # noqa: SIM118 (safe_open is not a mapping)


@contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """Modules built inside get their parameters on the meta device (no memory; an initializer
    run on them does nothing) and their buffers as usual (a rotary table is computed, not read)."""
    register = torch.nn.Module.register_parameter

    def on_meta(module: torch.nn.Module, name: str, param: torch.nn.Parameter | None) -> None:
        if param is not None and not param.is_meta:
            param = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    torch.nn.Module.register_parameter = on_meta  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register  # type: ignore[method-assign]


def _meta_model(spec: ModelSpec) -> torch.nn.Module:
    """The checkpoint's model with every parameter on the meta device."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if spec.model_dir is None:
        raise InvalidConfigError("a meta model is built from a checkpoint folder (ModelSpec.model_dir)")
    config = AutoConfig.from_pretrained(str(checkpoint_folder(spec.model_dir)), local_files_only=True)
    with _parameters_on_meta():
        model: torch.nn.Module = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]
    return model


@torch.no_grad()
def _load_shards(
    root: torch.nn.Module, model: torch.nn.Module, files: dict[str, Path], mesh: DeviceMesh
) -> None:
    """Give the sharded meta ``model`` (under the FSDP ``root``) this rank's memory and read its
    shard of each parameter from ``files``, one whole tensor at a time; buffers keep what they
    were built with unless the checkpoint holds them."""
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    root.to_empty(device="cpu")
    parameters = dict(model.named_parameters())  # a tied weight once, under its first name
    if missing := sorted(set(parameters) - set(files)):
        raise InvalidConfigError(f"the checkpoint holds no {', '.join(missing[:5])} ({len(missing)} missing)")
    by_file: dict[Path, list[str]] = {}
    for name in [*parameters, *buffers]:
        if name in files:
            by_file.setdefault(files[name], []).append(name)
    for file, names in by_file.items():
        with safe_open(str(file), framework="pt") as f:
            for name in names:
                whole = f.get_tensor(name)
                if name in buffers:
                    buffers[name] = whole
                    continue
                param = cast(DTensor, parameters[name])
                if tuple(whole.shape) != tuple(param.shape):
                    raise InvalidConfigError(
                        f"{name} is {tuple(whole.shape)} in the checkpoint, {tuple(param.shape)} in its config"
                    )
                shard = distribute_tensor(whole.to(torch.float32), mesh, param.placements, src_data_rank=None)
                param.to_local().copy_(shard.to_local())
                del whole, shard
    for name, buffer in model.named_buffers():
        buffer.copy_(buffers[name])


def _row_of(step: MicroStep, r: int, start: int, end: int) -> MicroStep:
    """Row ``r`` of ``step`` (its tokens ``start:end``) as a micro-step of its own."""
    cut = slice(start, end)
    return dataclasses.replace(
        step,
        rows=step.rows[r : r + 1],
        token_ids=step.token_ids[cut],
        position_ids=step.position_ids[cut],
        row_starts=np.array([0, end - start], dtype=np.int32),
        target_mask=step.target_mask[cut],
        behaviour_logprobs=step.behaviour_logprobs[cut],
        slots=step.slots[cut],
        coefficients=step.coefficients[cut],
    )


def _sum_of_squares(flat: torch.Tensor, chunk: int = 1 << 20) -> torch.Tensor:
    """The sum of `flat`'s squares in float64, a chunk at a time: a float64 copy of a whole
    shard and its square would be four times the shard, the largest transient of an update."""
    total = torch.zeros((), dtype=torch.float64)
    for start in range(0, flat.numel(), chunk):
        total += flat[start : start + chunk].double().square().sum()
    return total


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


@dataclass(frozen=True, eq=False)
class GatheredModel:
    """An FSDP cell's whole model, gathered on its leader: what the publisher sends."""

    model: torch.nn.Module  # the leader's sharded module: its config and `save_pretrained`
    tensors: dict[str, torch.Tensor]
    training_state: dict[str, Any] | None = None  # the optimizer's, every moment whole

    def save_training_state(self, path: Path) -> Path | None:
        """The optimizer's state in the unsharded layout, for a resumed core (sharded or not);
        None before the first update."""
        return None if self.training_state is None else write_whole(self.training_state, path)

    def named_tensors(self) -> dict[str, torch.Tensor]:
        return self.tensors

    def save(self, path: Path) -> Path:
        """`save_pretrained`, a tied weight once (under its first name), as an unsharded save."""
        path.mkdir(parents=True, exist_ok=True)
        once: dict[int, str] = {}
        for name, tensor in self.tensors.items():
            once.setdefault(id(tensor), name)
        unique = {name: self.tensors[name] for name in once.values()}
        self.model.save_pretrained(str(path), state_dict=unique)  # type: ignore[operator]
        return path


@dataclass(eq=False)
class FsdpBackend(TorchBackend):
    """This rank's shard of an FSDP cell's replica; `group` is the cell's ranks (all of them
    build the backend together: sharding is collective)."""

    group: Any = None  # torch.distributed ProcessGroup of the cell's ranks
    _mesh: DeviceMesh = field(init=False)

    def __post_init__(self) -> None:
        if self.training.shard != "fsdp":
            raise InvalidConfigError(f"FsdpBackend shards with fsdp, got shard {self.training.shard!r}")
        if self.group is None:
            raise InvalidConfigError("an FSDP backend needs its cell's process group")
        if dist.get_world_size(self.group) != self.training.ranks:
            raise InvalidConfigError(
                f"the cell's group has {dist.get_world_size(self.group)} ranks, fsdp expects {self.training.ranks}"
            )
        torch.set_num_threads(self.spec.torch_threads)
        fix_mmap_threshold()
        files = None if self.spec.model_dir is None else checkpoint_tensor_files(Path(self.spec.model_dir))
        # a checkpoint is loaded shard by shard below; a seeded model is built whole, then sharded
        model = _meta_model(self.spec) if files is not None else build_model(self.spec)
        model.train()
        if self.training.activation_checkpointing:
            enable_activation_checkpointing(model)
        self._mesh = DeviceMesh.from_group(self.group, device_type="cpu")
        dtype = self.training.compute_dtype
        # float32 shards are the master weights the optimizer steps; bfloat16 is what is gathered
        # and computed with; gradients are reduce-scattered (and accumulated) in float32.
        policy = (
            MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
            if dtype != torch.float32
            else MixedPrecisionPolicy()
        )
        embeddings = model.get_input_embeddings()  # type: ignore[operator]
        head = model.get_output_embeddings()  # type: ignore[operator]
        ignored: set[torch.nn.Parameter] = set()
        if _vocabulary_parallel_fits(embeddings, head):
            # the embeddings and the head (half of a small model) are split by vocabulary rows and
            # never gathered: their whole weights and gradients never exist on a rank
            for module, kind in ((embeddings, _ShardedEmbeddingModule), (head, _ShardedHead)):
                ignored.add(_vocabulary_parallel(module, kind, self._mesh, self.group, dtype))
        else:
            head = None  # a tied or unusual head stays in the root unit, with the embeddings
        for layer in _decoder_layers(model):
            fully_shard(layer, mesh=self._mesh, mp_policy=policy)
        self._root = _Logprobs(model, head)
        fully_shard(self._root, mesh=self._mesh, mp_policy=policy, ignored_params=ignored or None)
        if files is not None:
            _load_shards(self._root, model, files, self._mesh)
        self.model = model
        self._params = [p for p in model.parameters() if p.requires_grad]

    def _locals(self) -> list[torch.Tensor]:
        return [cast(DTensor, p).to_local() for p in self._params]

    @property
    def numel(self) -> int:
        """Values in this rank's shard."""
        return sum(t.numel() for t in self._locals())

    def logprobs(self, step: MicroStep, *, grad: bool) -> torch.Tensor:
        """[T] packed logprobs; collective over the cell (each layer is gathered to compute)."""
        _trim_heap()  # what the previous pass freed (a backward ends outside this backend)
        with torch.set_grad_enabled(grad):
            logprobs: torch.Tensor = self._root(step)
        _trim_heap()
        return logprobs

    def accumulate_gradients(self, step: MicroStep, loss_of: LossOfLogprobs) -> float:
        """The micro-step's loss share, its gradient added to this rank's shard; collective.

        The loss is taken on logprobs computed without a graph; then each row with targets runs
        forward again and back-propagates its part of the loss's gradient with respect to those
        logprobs (the chain rule through them), so every layer's gradient is reduce-scattered
        once per row. In one backward over every row, each layer's whole gradient would wait for
        its last row (the body runs once per row, `packed_token_logprobs`): every layer's whole
        gradient, held by every rank at once. The price is one more forward pass."""
        bounds = step.row_starts.tolist()
        if len(bounds) <= 2:  # one row: one pass
            return super().accumulate_gradients(step, loss_of)
        leaf = self.logprobs(step, grad=False).requires_grad_(True)
        loss = loss_of(leaf)
        if not loss.requires_grad:  # a share without targets has no graph
            return float(loss.detach())
        (grad,) = torch.autograd.grad(loss, leaf)
        targets = step.target_mask & (step.position_ids > 0)  # the same on every rank
        for r, (start, end) in enumerate(itertools.pairwise(bounds)):
            if targets[start:end].any():
                row = self.logprobs(_row_of(step, r, start, end), grad=True)
                torch.autograd.backward([row], [grad[start:end]])
        return float(loss.detach())

    def flat_parameters(self) -> torch.Tensor:
        return torch.cat([t.detach().reshape(-1) for t in self._locals()])

    @torch.no_grad()
    def load_flat_parameters(self, flat: torch.Tensor) -> None:
        if flat.numel() != self.numel:
            raise InvalidConfigError(f"flat parameters have {flat.numel()} values, this shard {self.numel}")
        offset = 0
        for local in self._locals():  # views of the sharded storage FSDP gathers from
            local.copy_(flat[offset : offset + local.numel()].view_as(local))
            offset += local.numel()

    @torch.no_grad()
    def flat_gradients(self) -> torch.Tensor:
        """This rank's accumulated shard gradient as one vector, which the gradients then live in:
        each parameter's gradient is moved into its place and replaced by a view of it, so the
        vector and the gradients are never both held whole (a caller that changes the vector
        changes the gradients; clone it to keep a copy). Zeros where a parameter has none."""
        flat = torch.empty(self.numel)
        for p, piece in zip(self._params, self._sharded(flat, copy=False), strict=True):
            if p.grad is None:
                piece.to_local().zero_()
            else:
                piece.to_local().copy_(cast(DTensor, p.grad).to_local())
            p.grad = piece  # the old gradient is freed here
        return flat

    def _sharded(self, flat: torch.Tensor, *, copy: bool = True) -> list[DTensor]:
        """This rank's flat shard vector as one DTensor per parameter (no copy across ranks);
        views of `flat` unless `copy`."""
        out, offset = [], 0
        for p, local in zip(self._params, self._locals(), strict=True):
            chunk = flat[offset : offset + local.numel()].view_as(local)
            chunk = chunk.clone() if copy else chunk
            offset += local.numel()
            tensor = cast(DTensor, p)
            out.append(
                DTensor.from_local(
                    chunk, self._mesh, tensor.placements, run_check=False, shape=p.shape, stride=p.stride()
                )
            )
        return out

    def apply_update(self, flat_gradients: torch.Tensor) -> float:
        """Clip by the global norm over every shard of the cell and step each shard; collective.

        AdamW and SGD act element by element, so stepping each shard equals stepping the whole.
        The step reads `flat_gradients` in place (no copy beside it; the accumulated gradients
        are dropped first), and a clip scales it in place: the caller's vector is consumed."""
        if self._optimizer is None:
            self._optimizer = self._make_optimizer()
        self.zero_gradients()
        for p, grad in zip(self._params, self._sharded(flat_gradients, copy=False), strict=True):
            p.grad = grad
        squares = _sum_of_squares(flat_gradients).reshape(1)  # this shard's share of |g|^2
        dist.all_reduce(squares, group=self.group)
        norm = float(squares.sqrt())
        max_norm = self.optimizer_config.max_grad_norm
        if max_norm > 0 and norm > max_norm:
            # clip_grad_norm_'s coefficient, so a clipped step equals the unsharded one
            coefficient = max_norm / (norm + 1e-6)
            for p in self._params:
                cast(DTensor, p.grad).to_local().mul_(coefficient)
        _trim_heap()
        self._optimizer.step()
        self.zero_gradients()
        return norm

    def named_tensors(self) -> dict[str, torch.Tensor]:
        """The whole model by name, gathered on every rank of the cell (collective); tied names
        share one gathered tensor."""
        gathered: dict[int, torch.Tensor] = {}
        named: dict[str, torch.Tensor] = {}
        for name, tensor in self.model.state_dict(keep_vars=True).items():  # tied: one object
            if id(tensor) not in gathered:
                gathered[id(tensor)] = _full(tensor).detach()
            named[name] = gathered[id(tensor)]
        return named

    def full_named_tensors(self) -> dict[str, torch.Tensor]:
        return self.named_tensors()

    def full_named_of(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """A flat shard vector (a batch gradient) as whole tensors by parameter name (collective)."""
        names = [name for name, p in self.model.named_parameters() if p.requires_grad]
        return {name: t.full_tensor() for name, t in zip(names, self._sharded(flat), strict=True)}

    def gathered(self) -> GatheredModel:
        """The whole model and optimizer state for publication (collective; every rank holds
        them until they are dropped)."""
        state = None
        if self._optimizer is not None:
            saved = self._optimizer.state_dict()
            moments = {k: {n: _full(v) for n, v in s.items()} for k, s in saved["state"].items()}
            state = {"state": moments, "param_groups": saved["param_groups"]}
        return GatheredModel(self.model, self.named_tensors(), state)

    def _make_optimizer(self) -> torch.optim.Optimizer:
        """The optimizer, resumed from a whole (unsharded-layout) state: each rank keeps its shard."""
        optimizer = make_optimizer(self._params, self.optimizer_config)
        if self.optimizer_config.state_path is not None:
            whole = read_whole(self.optimizer_config.state_path)
            for key, moments in whole["state"].items():
                p = cast(DTensor, self._params[int(key)])
                for name, value in moments.items():
                    if value.shape == p.shape:  # a moment; `step` stays whole
                        moments[name] = distribute_tensor(value, self._mesh, p.placements, src_data_rank=None)
            optimizer.load_state_dict(whole)
        return optimizer

    def save(self, path: Path) -> Path:
        """`save_pretrained` of the whole model into `path` by the cell's first rank (collective)."""
        gathered = self.gathered()
        if dist.get_rank(self.group) == 0:
            gathered.save(path)
        return path

    def save_training_state(self, path: Path) -> Path | None:
        """The optimizer's state, gathered whole, by the cell's first rank (collective)."""
        gathered = self.gathered()
        return gathered.save_training_state(path) if dist.get_rank(self.group) == 0 else None
