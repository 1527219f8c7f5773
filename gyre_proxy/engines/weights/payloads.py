"""Moving weights to an engine: tensor payloads and the broadcast group.

Two payload formats for ``/update_weights_from_tensor``:
- SGLang's own (``sglang_tensor_payload``, no ``load_format``): a base64 ``ForkingPickler``
  dump of ``[(name, tensor)]`` whose tensors travel as shared-memory files, so the engine must
  be on the same host and the dump must use the ``file_system`` sharing strategy.
- ``serialize_safetensors`` (``load_format="gyre_safetensors"``): base64 safetensors bytes,
  the only format gyre's reference engine accepts, because it never unpickles request bodies.

``WeightUpdateGroup`` is one end of the gloo group behind ``/init_weights_update_group`` and
``/update_weights_from_distributed``: the trainer is rank 0 and broadcasts each tensor. Its
store layout was checked against a real SGLang 0.5.23 server.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import io
from collections.abc import Awaitable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Self, cast

import torch
from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo, TCPStore

from gyre_proxy.engines import wire as engine_api

GYRE_SAFETENSORS_FORMAT = "gyre_safetensors"


def serialize_safetensors(tensors: Mapping[str, torch.Tensor]) -> str:
    """Base64 safetensors bytes of ``tensors`` (contiguous CPU copies)."""
    from safetensors.torch import save

    # A copy of each: tied weights (an embedding shared with the output layer) share memory,
    # which safetensors refuses.
    plain = {name: tensor.detach().to("cpu", copy=True).contiguous() for name, tensor in tensors.items()}
    return base64.b64encode(save(plain)).decode("ascii")


class TensorSet(Mapping[str, torch.Tensor]):
    """Named tensors published to several engines at once: the ``gyre_safetensors`` payload is
    serialized on first use and shared by every engine it goes to, not made once per engine
    (it is about twice the state dict: the bytes, then their base64 text)."""

    def __init__(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self._tensors = dict(tensors)
        self._safetensors: str | None = None
        self.serialized = 0  # payloads made (1 after any number of engines)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._tensors[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def safetensors_payload(self) -> str:
        """``serialize_safetensors`` of these tensors, made once."""
        if self._safetensors is None:
            self._safetensors = serialize_safetensors(self._tensors)
            self.serialized += 1
        return self._safetensors


def safetensors_payload(tensors: Mapping[str, torch.Tensor]) -> str:
    """The ``gyre_safetensors`` payload of ``tensors``: a ``TensorSet``'s shared one, else made now."""
    return tensors.safetensors_payload() if isinstance(tensors, TensorSet) else serialize_safetensors(tensors)


def deserialize_safetensors(payload: str) -> dict[str, torch.Tensor]:
    """Inverse of ``serialize_safetensors``; raises ``ValueError`` on a bad payload."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        return load(base64.b64decode(payload, validate=True))
    except (SafetensorError, ValueError) as exc:
        raise ValueError(f"not a base64 safetensors payload: {exc}") from exc


def serialize_for_sglang(named_tensors: Sequence[tuple[str, torch.Tensor]]) -> str:
    """SGLang's ``MultiprocessingSerializer`` format, pickled under the current sharing strategy.

    Low level: the tensors' storages move into shared memory in place. Use
    ``sglang_tensor_payload`` to send to a server.
    """
    from multiprocessing.reduction import ForkingPickler

    buffer = io.BytesIO()
    ForkingPickler(buffer).dump(list(named_tensors))
    return base64.b64encode(buffer.getvalue()).decode("ascii")


@contextlib.contextmanager
def sglang_tensor_payload(tensors: Mapping[str, torch.Tensor]) -> Iterator[str]:
    """One TP rank's payload for a same-host SGLang ``/update_weights_from_tensor``, in scope.

    The tensors are copied (the caller's storages stay private) into shared-memory files
    named in the pickle. The ``file_system`` strategy is set only for the dump: under the
    default ``file_descriptor`` one the pickle holds descriptors another process cannot open.
    Leave the block only after the engine answered: SGLang opens the files while it handles
    the request, and leaving drops the copies, which unlinks each file once the engine has
    released it too. A payload the engine never opened stays in ``/dev/shm`` (the pickle holds
    a reference for its reader) until the process's ``torch_shm_manager`` exits.
    """
    import torch.multiprocessing as torch_mp

    copies = [(name, tensor.detach().to("cpu", copy=True)) for name, tensor in tensors.items()]
    # torch.multiprocessing's strategy functions carry no annotations.
    previous = torch_mp.get_sharing_strategy()  # type: ignore[no-untyped-call]
    torch_mp.set_sharing_strategy("file_system")  # type: ignore[no-untyped-call]
    try:
        payload = serialize_for_sglang(copies)
    finally:
        torch_mp.set_sharing_strategy(previous)  # type: ignore[no-untyped-call]
    try:
        yield payload
    finally:
        copies.clear()


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``, the spelling ``/update_weights_from_distributed`` uses."""
    return str(dtype).removeprefix("torch.")


def distributed_request(
    tensors: Mapping[str, torch.Tensor], *, group_name: str, weight_version: str
) -> engine_api.UpdateWeightsFromDistributedRequest:
    """The ``/update_weights_from_distributed`` body announcing ``tensors`` in their order."""
    return engine_api.UpdateWeightsFromDistributedRequest(
        names=list(tensors),
        dtypes=[dtype_name(tensor.dtype) for tensor in tensors.values()],
        shapes=[list(tensor.shape) for tensor in tensors.values()],
        group_name=group_name,
        weight_version=weight_version,
    )


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


class WeightUpdateGroup:
    """One rank of a named gloo group (rank 0 sends); a context manager.

    The store layout nests prefixes the way ``torch.distributed`` does for a named group
    created through its rendezvous (``group_name``, then ``group_name/``, then ``cpu/``), the
    path SGLang's custom process groups take.
    """

    def __init__(
        self,
        *,
        master_address: str,
        master_port: int,
        rank: int,
        world_size: int,
        group_name: str = "weight_update_group",
        timeout_s: float = 60.0,
    ) -> None:
        timeout = datetime.timedelta(seconds=timeout_s)
        self.rank = rank
        self.group_name = group_name
        self._store = TCPStore(
            master_address,
            master_port,
            world_size,
            is_master=rank == 0,
            timeout=timeout,
            wait_for_workers=False,
        )
        scoped = PrefixStore("cpu/", PrefixStore(f"{group_name}/", PrefixStore(group_name, self._store)))
        self._group = ProcessGroupGloo(scoped, rank, world_size, timeout)

    def broadcast(self, tensor: torch.Tensor) -> torch.Tensor:
        """Rank 0 sends ``tensor``; every other rank receives into it. Returns ``tensor``."""
        # The stubs declare broadcast on ProcessGroup only; the gloo backend has it too.
        cast(Any, self._group).broadcast(tensor, 0).wait()
        return tensor

    def send_all(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Rank 0: broadcast every tensor in order, as contiguous CPU copies.

        The engines receive in the order of the ``names`` of the matching
        ``/update_weights_from_distributed`` request (``distributed_request``).
        """
        for tensor in tensors.values():
            self.broadcast(tensor.detach().to("cpu").contiguous())

    def close(self) -> None:
        self._group.shutdown()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


async def open_weight_update_group(
    joins: Awaitable[object],
    *,
    master_address: str,
    master_port: int,
    world_size: int,
    group_name: str,
    timeout_s: float = 60.0,
) -> WeightUpdateGroup:
    """Open the trainer's end (rank 0) of a group while `joins` (the engines'
    ``/init_weights_update_group`` calls) run; returns it once every rank is in.

    Rank 0 must listen while the engines join: SGLang's scheduler blocks on the join until
    every rank is in, so the trainer's end cannot wait for their answers first.
    """
    trainer, _ = await asyncio.gather(
        asyncio.to_thread(
            WeightUpdateGroup,
            master_address=master_address,
            master_port=master_port,
            rank=0,
            world_size=world_size,
            group_name=group_name,
            timeout_s=timeout_s,
        ),
        joins,
    )
    return trainer
