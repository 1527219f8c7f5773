"""The PyTorch training backend: any Hugging Face causal LM, one replica per cell.

A cell's backend computes packed logprobs, accumulates gradients micro-step by micro-step, and
moves parameters and gradients as one flat float32 vector (the unit a snapshot, a reduction or a
broadcast carries). Only the core calls `apply_update`: it owns the one optimizer. Data parallel
reduction across cells is in gyre_train.cells (replica.py, gloo on the CPU). `TorchTraining`
says how a cell trains (compute dtype, activation checkpointing, FSDP sharding: fsdp.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from gyre_train.exceptions import InvalidConfigError
from gyre_train.objective import packed_token_logprobs
from gyre_train.trajectories import MicroStep


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """How every cell builds the same model: a Hugging Face config (with `model_type`) and a seed,
    or a folder written by `save_pretrained` (`model_dir`, which then wins over both).

    Built like the reference engine builds its model (seed, then `from_config`, or the folder),
    so a trainer and an engine made from the same spec start from identical weights.
    """

    config: Mapping[str, Any]
    seed: int = 0
    torch_threads: int = 1
    model_dir: Path | None = None


@dataclass(frozen=True, slots=True)
class OptimizerConfig:
    """The core's optimizer: AdamW (or plain SGD) and the global gradient-norm clip (0: none)."""

    kind: str = "adamw"
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    # The optimizer's state to start from (``TorchBackend.save_training_state``): a resumed
    # core keeps its moments instead of starting them from zero.
    state_path: Path | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("adamw", "sgd"):
            raise InvalidConfigError(f"optimizer kind must be adamw or sgd, got {self.kind!r}")
        if self.lr <= 0 or self.max_grad_norm < 0:
            raise InvalidConfigError("lr must be positive and max_grad_norm >= 0")


SHARDS = ("none", "fsdp")
DTYPES: Mapping[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True, slots=True)
class TorchTraining:
    """How a PyTorch cell trains its model.

    `shard`: "none" (every rank of the cell holds the whole model; one rank) or "fsdp" (FSDP2
    over the cell's `ranks`, each holding 1/ranks of the weights, gradients and optimizer
    state). `dtype`: the compute dtype; under "bfloat16" the weights the optimizer steps stay
    float32 (the master weights) and only the forward and backward run in bfloat16.
    `activation_checkpointing`: each decoder layer's activations are recomputed in backward.
    `device`: where an unsharded cell's model, gradients and optimizer state live: "cpu" (the
    default), "cuda" (the process's current CUDA device) or "cuda:N". The flat vectors a cell
    exchanges (`flat_parameters`, `flat_gradients`) stay on that device; the replica moves them
    to where its collectives run (replica.py).
    """

    shard: str = "none"
    ranks: int = 1
    dtype: str = "float32"
    activation_checkpointing: bool = False
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.shard not in SHARDS:
            raise InvalidConfigError(f"shard must be one of {list(SHARDS)}, got {self.shard!r}")
        if self.dtype not in DTYPES:
            raise InvalidConfigError(f"dtype must be one of {list(DTYPES)}, got {self.dtype!r}")
        if self.shard == "fsdp" and self.ranks < 2:
            raise InvalidConfigError(f"fsdp shards over at least 2 ranks per cell, got {self.ranks}")
        if self.shard == "none" and self.ranks != 1:
            raise InvalidConfigError(f"an unsharded cell has 1 rank, got {self.ranks} (use fsdp)")
        check_device_name(self.device)
        if self.shard == "fsdp" and self.device != "cpu":
            raise InvalidConfigError(
                f"fsdp cells train on the CPU only (got device {self.device!r}): sharding on GPUs is not built"
            )

    @property
    def compute_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def torch_device(self) -> torch.device:
        """The device itself; raises InvalidConfigError where this process sees no such CUDA device."""
        return resolve_device(self.device)


def check_device_name(name: str) -> None:
    """Raise InvalidConfigError unless ``name`` is "cpu", "cuda" or "cuda:N" (not whether it exists)."""
    head, sep, index = name.partition(":")
    if name == "cpu" or (head == "cuda" and (not sep or index.isdigit())):
        return
    raise InvalidConfigError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {name!r}")


def resolve_device(name: str) -> torch.device:
    """The torch device ``name`` names, checked against what this process sees: "cuda" is the
    current CUDA device (a cell process sets it from its local rank before building its model)."""
    check_device_name(name)
    if name == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise InvalidConfigError(f"device {name!r}: torch sees no CUDA device in this process")
    device = torch.device(name) if ":" in name else torch.device("cuda", torch.cuda.current_device())
    assert device.index is not None
    if device.index >= torch.cuda.device_count():
        raise InvalidConfigError(
            f"device {name!r}: this machine has {torch.cuda.device_count()} CUDA devices"
        )
    return device


LossOfLogprobs = Callable[[torch.Tensor], torch.Tensor]
"""Maps a micro-step's [T] packed logprobs to its scalar loss share."""


class TrainingBackend(Protocol):
    """What a cell needs of a model replica (or of one rank's shard of it).

    `logprobs` (pass 1, no graph) returns the [T] packed logprobs on every rank of the replica;
    `accumulate_gradients` (pass 2) runs the forward, applies `loss_of` where the logprobs live,
    back-propagates into the accumulated gradients and returns the loss value on every rank. A
    pipeline-parallel backend needs the loss inside its schedule, hence the callable.
    """

    @property
    def numel(self) -> int: ...

    def logprobs(self, step: MicroStep, *, grad: bool) -> torch.Tensor: ...
    def accumulate_gradients(self, step: MicroStep, loss_of: LossOfLogprobs) -> float: ...
    def flat_parameters(self) -> torch.Tensor: ...
    def load_flat_parameters(self, flat: torch.Tensor) -> None: ...
    def flat_gradients(self) -> torch.Tensor: ...
    def zero_gradients(self) -> None: ...
    def apply_update(self, flat_gradients: torch.Tensor) -> float: ...
    def named_tensors(self) -> dict[str, torch.Tensor]: ...
    def save(self, path: Path) -> Path: ...


# -- parameters as one flat vector, shared by every backend -------------------------------------


def flatten_parameters(params: Sequence[torch.nn.Parameter]) -> torch.Tensor:
    """[numel] the parameters, detached, in order."""
    return torch.cat([p.detach().reshape(-1) for p in params])


@torch.no_grad()
def load_flat_parameters(params: Sequence[torch.nn.Parameter], flat: torch.Tensor, what: str) -> None:
    """Copy ``flat`` into ``params`` in order; ``what`` names them in the error."""
    numel = sum(p.numel() for p in params)
    if flat.numel() != numel:
        raise InvalidConfigError(f"flat parameters have {flat.numel()} values, the {what} {numel}")
    offset = 0
    for p in params:
        p.copy_(flat[offset : offset + p.numel()].view_as(p))
        offset += p.numel()


def flatten_gradients(params: Sequence[torch.nn.Parameter]) -> torch.Tensor:
    """[numel] the gradients, zeros where a parameter has none."""
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])


def backward_loss(loss: torch.Tensor) -> float:
    """Back-propagate a scalar loss share (a share without targets has no graph) and return it."""
    if loss.requires_grad:
        torch.autograd.backward([loss])
    return float(loss.detach())


def make_optimizer(params: Sequence[torch.nn.Parameter], config: OptimizerConfig) -> torch.optim.Optimizer:
    # AdamW and SGD act element by element, so stepping each shard equals stepping the whole.
    if config.kind == "sgd":
        return torch.optim.SGD(params, lr=config.lr, weight_decay=config.weight_decay)
    return torch.optim.AdamW(params, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay)


def write_whole(state: Mapping[str, Any], path: Path) -> Path:
    """``torch.save`` to ``path``, whole or absent: a core killed mid-write leaves the old one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    torch.save(dict(state), partial)
    partial.replace(path)
    return path


def read_whole(path: Path) -> dict[str, Any]:
    """What ``write_whole`` wrote (an optimizer's state); raises InvalidConfigError when absent."""
    if not Path(path).is_file():
        raise InvalidConfigError(f"no optimizer state at {path}")
    state: dict[str, Any] = torch.load(path, weights_only=True, map_location="cpu")
    return state


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Recompute each decoder layer's activations in backward (non-reentrant: it composes with
    FSDP's hooks, which all-gather a layer's weights again for the recomputation)."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is None:
        raise InvalidConfigError(f"{type(model).__name__} has no activation checkpointing")
    enable(activation_checkpointing_kwargs={"use_reentrant": False})


def checkpoint_folder(model_dir: str | Path) -> Path:
    """`model_dir` as a path, refused unless it holds a model (a ``save_pretrained`` config.json)."""
    folder = Path(model_dir)
    if not (folder / "config.json").is_file():
        raise InvalidConfigError(f"{model_dir} holds no model (no config.json from save_pretrained)")
    return folder


def build_model(spec: ModelSpec) -> torch.nn.Module:
    """A float32 causal LM from `spec` on the CPU; never downloads."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if spec.model_dir is not None:
        loaded: torch.nn.Module = AutoModelForCausalLM.from_pretrained(
            str(checkpoint_folder(spec.model_dir)), local_files_only=True, dtype=torch.float32
        )
        return loaded
    values = dict(spec.config)
    model_type = values.pop("model_type", None)
    if not isinstance(model_type, str):
        raise InvalidConfigError("a model config needs a 'model_type' (for example 'qwen3')")
    hf_config = AutoConfig.for_model(model_type, **values)
    torch.manual_seed(spec.seed)
    model: torch.nn.Module = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)  # type: ignore[no-untyped-call]
    return model


@dataclass(eq=False)
class TorchBackend:
    """One replica of `spec`'s model; the optimizer is created on the first `apply_update`."""

    spec: ModelSpec
    optimizer_config: OptimizerConfig = field(default_factory=OptimizerConfig)
    training: TorchTraining = field(default_factory=TorchTraining)
    model: torch.nn.Module = field(init=False)
    _optimizer: torch.optim.Optimizer | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.training.shard != "none":
            raise InvalidConfigError("TorchBackend trains unsharded; a sharded cell uses FsdpBackend")
        torch.set_num_threads(self.spec.torch_threads)
        self.device = self.training.torch_device()
        self.model = build_model(self.spec).to(self.device)
        self.model.train()
        if self.training.activation_checkpointing:
            enable_activation_checkpointing(self.model)
        self._params = [p for p in self.model.parameters() if p.requires_grad]

    @property
    def numel(self) -> int:
        return sum(p.numel() for p in self._params)

    def logprobs(self, step: MicroStep, *, grad: bool) -> torch.Tensor:
        """[T] packed logprobs; with `grad=False` no graph is kept (pass 1).

        Under bfloat16 the model runs in autocast: the float32 parameters (the master weights)
        are cast per op, and the logprobs come out float32 as under float32."""
        dtype = self.training.compute_dtype
        with (
            torch.set_grad_enabled(grad),
            torch.autocast(self.device.type, dtype=dtype, enabled=dtype != torch.float32),
        ):
            return packed_token_logprobs(self.model, step).float()

    def accumulate_gradients(self, step: MicroStep, loss_of: LossOfLogprobs) -> float:
        return backward_loss(loss_of(self.logprobs(step, grad=True)))

    def flat_parameters(self) -> torch.Tensor:
        return flatten_parameters(self._params)

    def load_flat_parameters(self, flat: torch.Tensor) -> None:
        load_flat_parameters(self._params, flat.to(self.device), "model")

    def flat_gradients(self) -> torch.Tensor:
        return flatten_gradients(self._params)

    def zero_gradients(self) -> None:
        for p in self._params:
            p.grad = None

    def _make_optimizer(self) -> torch.optim.Optimizer:
        optimizer = make_optimizer(self._params, self.optimizer_config)
        if self.optimizer_config.state_path is not None:
            optimizer.load_state_dict(read_whole(self.optimizer_config.state_path))
        return optimizer

    def save_training_state(self, path: Path) -> Path | None:
        """The optimizer's state (its moments and step counts) to ``path``, for a core resumed
        from this policy; None when no update was made yet (nothing to keep)."""
        if self._optimizer is None and self.optimizer_config.state_path is None:
            return None
        if self._optimizer is None:
            self._optimizer = self._make_optimizer()
        return write_whole(self._optimizer.state_dict(), path)

    def apply_update(self, flat_gradients: torch.Tensor) -> float:
        """Clip the batch gradient by global norm and make one optimizer step; returns the norm.

        `flat_gradients` is already the batch gradient: every token's loss carries 1/(L_i * B*N),
        so the sum over micro-steps and cells is normalised and no count of cells or micro-steps
        enters here.
        """
        if self._optimizer is None:
            self._optimizer = self._make_optimizer()
        flat_gradients = flat_gradients.to(self.device)
        offset = 0
        for p in self._params:
            p.grad = flat_gradients[offset : offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        max_norm = self.optimizer_config.max_grad_norm
        if max_norm > 0:
            norm = float(torch.nn.utils.clip_grad_norm_(self._params, max_norm))
        else:
            norm = float(torch.linalg.vector_norm(flat_gradients))
        self._optimizer.step()
        self.zero_gradients()
        return norm

    def named_tensors(self) -> dict[str, torch.Tensor]:
        """The weights by name, in host memory (publication serialises or broadcasts them over
        gloo; an engine copies them onto its own device)."""
        return {name: t.detach().cpu() for name, t in self.model.state_dict().items()}

    def save(self, path: Path) -> Path:
        """`save_pretrained` into `path` (safetensors and config.json)."""
        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(str(path))  # type: ignore[operator]
        return path
