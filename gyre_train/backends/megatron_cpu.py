"""Megatron-core on a machine without a GPU: a scoped redirection of its CUDA calls to the CPU.

Megatron-core 0.16 builds its tensors with `device=torch.cuda.current_device()`, moves buffers
with `Tensor.cuda()`, forks a CUDA RNG state around every tensor-parallel region, orders work on
CUDA streams, and its distributed optimizer accepts only `torch.cuda.*Tensor` parameters. Inside
`cpu_megatron()` those calls land on the CPU (and the CPU generator); on exit everything is put
back. It does nothing when CUDA is available, and nothing at import time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from importlib import import_module
from typing import Any

import torch


def _cpu_rng_state(device: Any = None, clone: bool = False, graph_safe: bool = False) -> torch.Tensor:
    return torch.get_rng_state()


def _set_cpu_rng_state(new_state: torch.Tensor, device: Any = -1, graph_safe: bool = False) -> None:
    torch.set_rng_state(new_state)


def _cpu_manual_seed(seed: int) -> None:
    torch.manual_seed(seed)


def _tensor_cuda(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return self


_ORIGINAL_TENSOR_TYPE = torch.Tensor.type


def _tensor_type(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    # The distributed optimizer accepts only parameters whose type() is a torch.cuda.*Tensor;
    # a CPU tensor answers as its CUDA twin. Conversions (with arguments) are untouched.
    name = _ORIGINAL_TENSOR_TYPE(self, *args, **kwargs)
    if args or kwargs or not isinstance(name, str) or self.is_cuda:
        return name
    return name.replace("torch.", "torch.cuda.", 1)


def _current_device() -> str:
    # Every caller passes the result as `device=` or to `.to()`, where "cpu" is accepted.
    return "cpu"


_CUDA_DEVICE_STRINGS = ("cuda", "cuda:0")


def _redirect_device(factory: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def wrapper(*args: Any, **kwargs: Any) -> torch.Tensor:
        device = kwargs.get("device")
        if isinstance(device, torch.device):
            device = device.type
        if isinstance(device, str) and device in _CUDA_DEVICE_STRINGS:
            kwargs["device"] = "cpu"
        return factory(*args, **kwargs)

    return wrapper


class _NullStream:
    """Stands in for a CUDA stream: every operation on the CPU is already ordered.

    A class (not a factory) because it replaces `torch.cuda.Stream`, which libraries imported
    inside the block use in annotations such as `torch.cuda.Stream | None`.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        return None

    def wait_stream(self, stream: object) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def record_event(self, event: object = None) -> None:
        return None

    def __enter__(self) -> _NullStream:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def _null_stream(*args: Any, **kwargs: Any) -> _NullStream:
    return _NullStream()


def megatron_module(name: str) -> Any:
    """Import a Megatron-core module by name (megatron-core ships no type information)."""
    return import_module(name)


def _patch(stack: ExitStack, owner: Any, name: str, value: Any) -> None:
    original = getattr(owner, name)
    setattr(owner, name, value)
    stack.callback(setattr, owner, name, original)


@contextmanager
def cpu_megatron(force: bool = False) -> Iterator[bool]:
    """Redirect Megatron-core's CUDA calls to the CPU while the block runs; yields whether it did.

    Without `force` it does nothing when a GPU is present. Not thread-safe: the patches are on
    the `torch` module for the duration of the block, so run one Megatron model per process.
    """
    if torch.cuda.is_available() and not force:
        yield False
        return
    mcore_random = megatron_module("megatron.core.tensor_parallel.random")

    with ExitStack() as stack:
        _patch(stack, torch.cuda, "current_device", _current_device)
        _patch(stack, torch.cuda, "get_rng_state", _cpu_rng_state)
        _patch(stack, torch.cuda, "manual_seed", _cpu_manual_seed)
        _patch(stack, torch.cuda, "synchronize", lambda *a, **k: None)
        _patch(stack, torch.cuda, "current_stream", _null_stream)
        _patch(stack, torch.cuda, "default_stream", _null_stream)
        _patch(stack, torch.cuda, "Stream", _NullStream)
        _patch(stack, torch.cuda, "stream", _null_stream)
        _patch(stack, torch.Tensor, "cuda", _tensor_cuda)
        _patch(stack, torch.Tensor, "type", _tensor_type)
        _patch(stack, mcore_random, "_get_cuda_rng_state", _cpu_rng_state)
        _patch(stack, mcore_random, "_set_cuda_rng_state", _set_cpu_rng_state)
        for name in ("empty", "zeros", "ones", "tensor", "arange", "full"):
            _patch(stack, torch, name, _redirect_device(getattr(torch, name)))
        yield True
