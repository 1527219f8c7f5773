"""Weight transport from the core to satellites joining a batch in flight.

The core exposes a flat snapshot of its authoritative weights after every update (weights are
frozen during gradient accumulation, so the snapshot is consistent for the whole batch); a
joining satellite pulls it. `MooncakeTransport` reads the core's registered buffer one-sidedly
(Transfer Engine over TCP on the CPU, RDMA on a cluster), so the core never pauses.
`TorchDistributedTransport` is the fallback: the satellite asks, and the core answers with a
point-to-point send between two micro-steps. Broadcasts after an update and publication to
engines are not here (see replica.py and publish.py).
"""

from __future__ import annotations

import importlib
import time
from typing import Any, Protocol

import torch
import torch.distributed as dist

from gyre_train.cells.board import SnapshotBoard, SnapshotDescriptor
from gyre_train.exceptions import WeightTransportError


class WeightTransport(Protocol):
    """One end (core or satellite) of the snapshot transport; a context manager."""

    name: str

    @property
    def segment(self) -> str:
        """Where peers read this end's exposed memory (Mooncake's ``host:port``); "" for none."""
        ...

    def expose(self, flat: torch.Tensor, policy_version: int) -> None:
        """Core: make `flat` (the weights at `policy_version`) the snapshot satellites pull."""
        ...

    def serve(self) -> int:
        """Core: answer pulls that need the core's help; returns how many it answered."""
        ...

    def pull(self, into: torch.Tensor, policy_version: int, timeout_s: float = 60.0) -> None:
        """Satellite: copy the snapshot at `policy_version` into `into` (flat float32)."""
        ...

    def close(self) -> None: ...


def wait_for_snapshot(board: SnapshotBoard, version: int, timeout_s: float) -> SnapshotDescriptor:
    """The board's snapshot descriptor once it is at `version`; WeightTransportError on timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        descriptor = board.snapshot()
        if descriptor is not None and descriptor.policy_version == version:
            return descriptor
        if time.monotonic() > deadline:
            have = None if descriptor is None else descriptor.policy_version
            raise WeightTransportError(f"no snapshot of version {version} within {timeout_s} s (have {have})")
        time.sleep(0.002)


class TorchDistributedTransport:
    """Snapshots over torch.distributed point-to-point (gloo on the CPU, NCCL on a GPU)."""

    name = "torch"

    def __init__(self, board: SnapshotBoard, cell: int, core: int = 0) -> None:
        self._board = board
        self._cell = cell
        self._core = core
        self._flat: torch.Tensor | None = None

    def __enter__(self) -> TorchDistributedTransport:
        return self

    @property
    def segment(self) -> str:
        return ""  # the core sends; nothing is read from its memory

    def __exit__(self, *exc: object) -> None:
        self.close()

    def expose(self, flat: torch.Tensor, policy_version: int) -> None:
        self._flat = flat.detach().clone()
        self._board.put_snapshot(SnapshotDescriptor(policy_version, int(flat.numel()), self.name))

    def serve(self) -> int:
        served = 0
        while (cell := self._board.next_pull()) is not None:
            if self._flat is None:
                raise WeightTransportError("a satellite asked for weights before the core exposed any")
            dist.send(self._flat, dst=cell)
            served += 1
        return served

    def pull(self, into: torch.Tensor, policy_version: int, timeout_s: float = 60.0) -> None:
        descriptor = wait_for_snapshot(self._board, policy_version, timeout_s)
        if descriptor.numel != into.numel():
            raise WeightTransportError(f"snapshot has {descriptor.numel} values, this cell {into.numel()}")
        self._board.request_pull(self._cell)
        dist.recv(into, src=self._core)

    def close(self) -> None:
        self._flat = None


class MooncakeTransport:
    """Snapshots read one-sidedly from the core's registered buffer with Mooncake Transfer Engine.

    Needs `mooncake-transfer-engine-non-cuda` (and libibverbs1) on the CPU; protocol "tcp" here,
    "rdma" on a cluster with RDMA devices. No metadata server: P2P handshake on `host`.
    """

    name = "mooncake"

    def __init__(
        self, board: SnapshotBoard, cell: int, host: str = "127.0.0.1", protocol: str = "tcp"
    ) -> None:
        try:
            engine_module = importlib.import_module("mooncake.engine")
        except ImportError as exc:
            raise WeightTransportError(
                "MooncakeTransport needs mooncake-transfer-engine-non-cuda (pip) and libibverbs1 (apt)"
            ) from exc
        self._board = board
        self._cell = cell
        self._host = host
        self._engine: Any = engine_module.TransferEngine()
        if self._engine.initialize(host, "P2PHANDSHAKE", protocol, "") != 0:
            raise WeightTransportError(f"Transfer Engine did not initialize on {host} over {protocol}")
        self._segment = f"{host}:{self._engine.get_rpc_port()}"
        self._buffer: torch.Tensor | None = None  # the core's exposed snapshot
        self._registered: dict[int, int] = {}  # address -> bytes

    def __enter__(self) -> MooncakeTransport:
        return self

    @property
    def segment(self) -> str:
        return self._segment

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _register(self, tensor: torch.Tensor) -> None:
        address, size = tensor.data_ptr(), tensor.numel() * tensor.element_size()
        if self._registered.get(address) == size:
            return
        if self._engine.register_memory(address, size) != 0:
            raise WeightTransportError(f"cannot register {size} bytes with the Transfer Engine")
        self._registered[address] = size

    def expose(self, flat: torch.Tensor, policy_version: int) -> None:
        if self._buffer is None or self._buffer.numel() != flat.numel():
            self._buffer = torch.empty(flat.numel(), dtype=torch.float32)
            self._register(self._buffer)
        # Satellites only read between the window opening and their first claim, and the core
        # only rewrites the buffer after the window of the batch has closed: no torn reads.
        self._buffer.copy_(flat.detach().reshape(-1))
        self._board.put_snapshot(
            SnapshotDescriptor(
                policy_version, int(flat.numel()), self.name, self._segment, self._buffer.data_ptr()
            )
        )

    def serve(self) -> int:
        return 0

    def pull(self, into: torch.Tensor, policy_version: int, timeout_s: float = 60.0) -> None:
        if into.dtype != torch.float32 or not into.is_contiguous():
            raise WeightTransportError("pull into a contiguous float32 tensor")
        descriptor = wait_for_snapshot(self._board, policy_version, timeout_s)
        if descriptor.numel != into.numel():
            raise WeightTransportError(f"snapshot has {descriptor.numel} values, this cell {into.numel()}")
        self._register(into)
        status = self._engine.transfer_sync_read(
            descriptor.segment, into.data_ptr(), descriptor.address, into.numel() * 4
        )
        if status != 0:
            raise WeightTransportError(f"Transfer Engine read from {descriptor.segment} failed ({status})")

    def close(self) -> None:
        for address in list(self._registered):
            self._engine.unregister_memory(address)
        self._registered.clear()
        self._buffer = None


WEIGHT_TRANSPORTS = (TorchDistributedTransport.name, MooncakeTransport.name)


def make_transport(name: str, board: SnapshotBoard, cell: int, host: str = "127.0.0.1") -> WeightTransport:
    """`"torch"` or `"mooncake"`; raises WeightTransportError for anything else. ``host`` is the
    address other machines reach this cell's Transfer Engine at (Mooncake): the segment a
    core's snapshot descriptor names, which satellites on other hosts read from."""
    if name == TorchDistributedTransport.name:
        return TorchDistributedTransport(board, cell)
    if name == MooncakeTransport.name:
        return MooncakeTransport(board, cell, host=host)
    raise WeightTransportError(f"unknown weight transport {name!r} (one of {list(WEIGHT_TRANSPORTS)})")
