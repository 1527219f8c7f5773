"""The host's end of the proxy route (``ProxyRoute``): ``UnixRelay`` serves a unix socket a
sandbox may connect to and forwards each connection to the proxy's TCP address, both ways, in
one daemon thread. The sandbox's end is ``INSIDE_SCRIPT``, a standalone forwarder the sandbox
runs on ``127.0.0.1:port`` of its own network namespace (``relay_inside``); ``route_binds`` and
``routed`` are how every confined kind (bwrap, podman, docker) shows it and starts it.

A unix socket, not a TCP port, crosses the sandbox boundary: a bind mount of its folder is all
a sandbox needs, and its network namespace keeps nothing but loopback.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
import threading
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

from gyre_train.exceptions import SandboxError
from gyre_train.sandbox import relay_inside
from gyre_train.sandbox.base import Bind, ProxyRoute
from gyre_train.sandbox.relay_inside import Pump

INSIDE_SCRIPT = Path(relay_inside.__file__).resolve()
SOCKET_MODE = 0o666  # the sandbox's unprivileged user (nobody) connects to it
MAX_SOCKET_PATH = 107  # sun_path holds 108 bytes with its NUL
JOIN_S = 5.0
ROUTE_DIR = "/run/gyre"  # the route socket's folder, as the sandbox sees it
FORWARDER = "/run/gyre-forward.py"  # relay_inside.py, as the sandbox sees it
SANDBOX_PYTHON = "/usr/bin/python3"  # the forwarder's interpreter, as the sandbox sees it
# $1 port, $2 socket, $3 name, then the command: the forwarder returns once the port listens;
# isolated (-I), so that the command's PYTHONPATH cannot shadow the forwarder's standard library
ROUTE_SH = (
    f'[ -x {SANDBOX_PYTHON} ] || {{ echo "gyre: the proxy route needs {SANDBOX_PYTHON} in the sandbox" >&2; exit 1; }}; '
    f'{SANDBOX_PYTHON} -I {FORWARDER} "$1" "$2" $$ "$3" || exit 1; shift 3; exec "$@"'
)


def check_route(route: ProxyRoute) -> None:
    """Raise SandboxError unless ``route`` names a TCP port and a socket that is served now."""
    if not 0 < route.port < 65536:
        raise SandboxError(f"route: port {route.port} is not a TCP port")
    try:
        served = stat.S_ISSOCK(route.socket.stat().st_mode)
    except OSError:
        served = False
    if not served:
        raise SandboxError(f"route: no socket at {route.socket}; start its relay (UnixRelay) first")


def route_binds(route: ProxyRoute) -> list[Bind]:
    """The socket's folder at ``ROUTE_DIR`` and the forwarder at ``FORWARDER``, both read-only:
    connecting to a socket needs no write access to its file system, and the folder stays the
    host's alone."""
    return [Bind(route.socket.parent, ROUTE_DIR), Bind(INSIDE_SCRIPT, FORWARDER)]


def routed(command: Sequence[str], route: ProxyRoute, name: str) -> list[str]:
    """``command`` (its limits already applied) started by ``ROUTE_SH`` once the forwarder
    listens on ``127.0.0.1:port``. The forwarder itself runs outside the command's ``prlimit``:
    a fork bomb at the process limit, or a CPU limit reached, must not take the route of the
    rest of the sandbox with it. ``name`` marks both processes for ``ps``."""
    socket_path = f"{ROUTE_DIR}/{route.socket.name}"
    return ["/bin/sh", "-c", ROUTE_SH, f"gyre-route {name}", str(route.port), socket_path, name, *command]


class UnixRelay:
    """Listens on ``socket_path`` and forwards each connection to ``target_host:target_port``.

    Use it as a context manager, or call ``start`` and ``close``. The socket is made writable by
    every user (a sandbox's user must connect); its folder must be traversable by that user,
    and is the caller's to choose. A stale socket at the path (nobody serves it) is replaced.
    """

    def __init__(self, socket_path: Path, target_host: str, target_port: int) -> None:
        if len(os.fsencode(socket_path)) > MAX_SOCKET_PATH:
            raise SandboxError(
                f"relay socket path {socket_path} is longer than {MAX_SOCKET_PATH} bytes; choose a shorter folder"
            )
        self.socket_path = socket_path
        self.target_host = target_host
        self.target_port = target_port
        self._pump: Pump | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Resolve the target and listen; raises SandboxError when either fails."""
        if self._pump is not None:
            raise SandboxError(f"relay on {self.socket_path} is already started")
        try:
            family, kind, proto, _name, address = socket.getaddrinfo(
                self.target_host, self.target_port, type=socket.SOCK_STREAM
            )[0]
        except socket.gaierror as exc:
            raise SandboxError(f"relay target {self.target_host}:{self.target_port}: {exc.strerror}") from exc
        self._remove_stale()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(str(self.socket_path))
            os.chmod(self.socket_path, SOCKET_MODE)
            listener.listen(relay_inside.BACKLOG)
        except OSError as exc:
            listener.close()
            raise SandboxError(f"relay cannot listen on {self.socket_path}: {exc.strerror}") from exc

        def connect() -> socket.socket:
            upstream = socket.socket(family, kind, proto)
            upstream.setblocking(False)
            if family in (socket.AF_INET, socket.AF_INET6):
                upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # streamed tokens
            error = upstream.connect_ex(address)
            if error not in (0, errno.EINPROGRESS):
                upstream.close()
                raise OSError(error, os.strerror(error))
            return upstream

        self._pump = Pump(listener, connect)
        self._thread = threading.Thread(
            target=self._pump.serve, name=f"gyre-relay {self.socket_path.name}", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Stop forwarding, close every connection and remove the socket; idempotent."""
        pump, thread, self._pump, self._thread = self._pump, self._thread, None, None
        if pump is None or thread is None:
            return
        pump.stop()
        thread.join(JOIN_S)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _remove_stale(self) -> None:
        try:
            mode = self.socket_path.lstat().st_mode
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(mode):
            raise SandboxError(f"relay socket path {self.socket_path} exists and is not a socket")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            if probe.connect_ex(str(self.socket_path)) == 0:
                raise SandboxError(f"relay socket {self.socket_path} is served by another relay")
        self.socket_path.unlink()
