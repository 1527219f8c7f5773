"""The reference engine's Mooncake Transfer Engine: KV payloads read engine to engine.

The source *exposes* a payload: it registers the bytes with its Transfer Engine and hands out
where they are (its segment and the address). The destination *reads* those bytes one-sidedly
into memory of its own. The source does nothing during the read, and the caller never holds
the payload. This module is the I/O seam only. Packing, checking and keeping entries belong
to ``engine.py`` and ``kvstore.py``.

Mooncake is optional. When it is not installed, does not import, or is turned off, ``status``
says why, every call raises ``TransferUnavailable``, and callers move the payload over HTTP.
The Transfer Engine starts at its first use, with a P2P handshake and no metadata server. An
engine that never migrates therefore opens no port.
"""

from __future__ import annotations

import importlib
import threading
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from gyre_proxy.exceptions import TransferFailed, TransferUnavailable

INSTALL_HINT = (
    "pip install 'gyre[mooncake]' (mooncake-transfer-engine-non-cuda) and apt-get install libibverbs1"
)


@dataclass(frozen=True)
class MooncakeConfig:
    """How the engine's Transfer Engine runs. ``enabled=False`` keeps Mooncake off even where it
    is installed."""

    enabled: bool = True
    host: str = "127.0.0.1"  # the address other engines reach this one's Transfer Engine on
    protocol: str = "tcp"  # "rdma" where RDMA devices are; both ends must use the same
    device_name: str = ""  # the RDMA devices to use; "" lets Mooncake discover them


class KvTransfer(Protocol):
    """Moves payload bytes from one engine's memory to another's without the caller."""

    @property
    def protocol(self) -> str: ...

    def status(self) -> tuple[bool, str]:
        """Whether this engine can expose and read payloads, and its segment or why not."""
        ...

    def expose(self, data: bytes) -> tuple[str, int]:
        """Register ``data`` for peers to read; returns this engine's segment and the address.
        The caller keeps ``data`` alive and unchanged until ``withdraw``."""
        ...

    def withdraw(self, address: int) -> None:
        """Stop exposing the bytes registered at ``address``."""
        ...

    def read(self, segment: str, address: int, nbytes: int) -> bytes:
        """``nbytes`` read from ``address`` in ``segment``'s exposed memory."""
        ...

    def close(self) -> None: ...


class MooncakeKvTransfer:
    """``KvTransfer`` over Mooncake Transfer Engine (TCP on a CPU machine, RDMA on a cluster).

    It is thread-safe. Reads run outside the lock, so several destinations' pulls proceed at
    once. Raises ``TransferUnavailable`` when Mooncake cannot be used, and ``TransferFailed``
    when a registration or a read fails.
    """

    def __init__(self, config: MooncakeConfig) -> None:
        self.config = config
        self._module: Any = None
        self._engine: Any = None
        self._segment = ""
        self._registered: dict[int, int] = {}  # address -> bytes
        self._lock = threading.Lock()
        self._reason: str | None = None  # why Mooncake cannot be used here; None while it can
        if not config.enabled:
            self._reason = "Mooncake is off in this engine's config (ReferenceEngineConfig.mooncake)"
            return
        try:
            self._module = importlib.import_module("mooncake.engine")
        except (ImportError, OSError) as exc:  # the wheel links libibverbs1 from the OS
            self._reason = f"Mooncake Transfer Engine does not import ({exc}): {INSTALL_HINT}"

    @property
    def protocol(self) -> str:
        return self.config.protocol

    def status(self) -> tuple[bool, str]:
        with self._lock:
            if self._reason is not None:
                return False, self._reason
            if self._engine is None:
                return True, f"{self.protocol} on {self.config.host}, started at the first migration"
            return True, f"{self.protocol} on {self._segment}"

    def _started(self) -> Any:
        """The running Transfer Engine, started if it was not (call with the lock held)."""
        if self._reason is not None:
            raise TransferUnavailable(self._reason)
        if self._engine is None:
            host, protocol = self.config.host, self.config.protocol
            engine = self._module.TransferEngine()
            try:
                status = engine.initialize(host, "P2PHANDSHAKE", protocol, self.config.device_name)
            except RuntimeError as exc:
                status = f"{exc}"
            if status != 0:
                # Not retried: a Transfer Engine that failed to start once is not half-used
                # later, and status() says why from now on.
                self._reason = f"Mooncake Transfer Engine did not start on {host} over {protocol} ({status})"
                raise TransferUnavailable(self._reason)
            self._engine = engine
            self._segment = f"{host}:{engine.get_rpc_port()}"
        return self._engine

    def _register(self, engine: Any, address: int, nbytes: int) -> None:
        if engine.register_memory(address, nbytes) != 0:
            raise TransferFailed(f"the Transfer Engine did not register {nbytes} bytes at {address:#x}")
        self._registered[address] = nbytes

    def _unregister(self, engine: Any, address: int) -> None:
        if self._registered.pop(address, None) is not None:
            engine.unregister_memory(address)

    def expose(self, data: bytes) -> tuple[str, int]:
        # The address of the bytes object's own buffer: the payload is exposed where pack()
        # wrote it, not copied again. Mooncake only reads it (the destination's one-sided
        # READ), and the caller keeps the object alive until withdraw().
        address = int(np.frombuffer(data, dtype=np.uint8).ctypes.data)
        with self._lock:
            self._register(self._started(), address, len(data))
            return self._segment, address

    def withdraw(self, address: int) -> None:
        with self._lock:
            if self._engine is not None:
                self._unregister(self._engine, address)

    def read(self, segment: str, address: int, nbytes: int) -> bytes:
        buffer = np.empty(nbytes, dtype=np.uint8)  # [nbytes], the payload once read
        local = int(buffer.ctypes.data)
        with self._lock:
            engine = self._started()
            self._register(engine, local, nbytes)  # RDMA writes only into registered memory
        try:
            status = engine.transfer_sync_read(segment, local, address, nbytes)
        except RuntimeError as exc:
            status = f"{exc}"
        finally:
            with self._lock:
                self._unregister(engine, local)
        if status != 0:
            raise TransferFailed(
                f"reading {nbytes} bytes at {address:#x} from {segment} over {self.protocol} failed "
                f"({status}): the source is not reachable there, or no longer exposes them (released)"
            )
        # safetensors loads from bytes only, so the payload is copied once more here.
        return buffer.tobytes()

    def close(self) -> None:
        """Unregister everything still exposed; later calls are ``TransferUnavailable``."""
        with self._lock:
            if self._engine is not None:
                for address in list(self._registered):
                    self._unregister(self._engine, address)
            self._engine = None  # the Transfer Engine stops when its last reference goes
            self._reason = self._reason or "the engine has shut down"
