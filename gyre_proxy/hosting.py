"""Serving an ASGI app on loopback from a background thread: the proxy's and the reference
engine's HTTP servers, for tests, demos and embedded runs.

``ServerThread`` is a context manager around one uvicorn server; ``free_port`` finds a port;
``advertised_url`` is what other machines call for a server listening on every address;
``reachable_host`` is the address they reach its machine at, and ``needs_advertise_host`` says
when a listening address names no such address.
It imports nothing of gyre_proxy but its exceptions, so the engine layer (below the proxy)
and the proxy's API both host their apps with it. Foreground serving stays with the callers.
"""

from __future__ import annotations

import socket
import threading
import time
from types import TracebackType
from typing import Any, Literal, Self
from urllib.parse import urlsplit

import uvicorn

from gyre_proxy.exceptions import ServerStartError

# uvicorn's default: an idle keep-alive connection is closed after 5 s.
DEFAULT_KEEP_ALIVE_S = 5


def reuseport_socket(host: str, port: int, *, backlog: int = 2048) -> socket.socket:
    """A listening TCP socket on ``host:port`` with ``SO_REUSEPORT``: several processes each open
    one on the same port and the kernel spreads new connections over them."""
    if not hasattr(socket, "SO_REUSEPORT"):
        raise ServerStartError("several workers on one port need SO_REUSEPORT, which this OS lacks")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        raise ServerStartError(f"cannot listen on {host}:{port}: {exc}") from exc
    sock.setblocking(False)
    return sock


WILDCARD_HOSTS = ("0.0.0.0", "::", "")  # listening on every address: not an address to call
LOOPBACK_HOST = "127.0.0.1"


def needs_advertise_host(host: str, advertise_host: str | None) -> bool:
    """True when a server listening on ``host`` gives other machines no address to call:
    ``advertise_host`` (None or empty: ``host`` itself) is a wildcard (``WILDCARD_HOSTS``).
    Callers that must be reachable from elsewhere refuse such a pair with their own message."""
    return (advertise_host or host) in WILDCARD_HOSTS


def reachable_host(host: str, advertise_host: str | None) -> str:
    """The address other machines reach this machine at, for a server listening on ``host``:
    ``advertise_host`` when given (not None or empty), else ``host``, else, for a wildcard
    ``host``, 127.0.0.1 (this machine only; see ``needs_advertise_host``)."""
    if advertise_host:
        return advertise_host
    return LOOPBACK_HOST if host in WILDCARD_HOSTS else host


def advertised_url(base_url: str, advertise_host: str | None) -> str:
    """The URL other machines call for a server listening at ``base_url``: its port at
    ``advertise_host``, or ``base_url`` itself when that is None or empty."""
    if not advertise_host:
        return base_url
    host = f"[{advertise_host}]" if ":" in advertise_host else advertise_host
    return f"http://{host}:{urlsplit(base_url).port}"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on ``host``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class ServerThread:
    """``app`` on ``http://host:port``, served by uvicorn from a daemon thread.

    With ``sock`` (a listening socket) it serves there instead of binding ``host:port``.
    Entering starts the thread and waits until the server accepts connections (at most
    ``startup_timeout_s``), raising ``ServerStartError`` naming ``name`` if it does not;
    leaving asks uvicorn to shut down gracefully and joins the thread.
    """

    def __init__(
        self,
        app: Any,
        *,
        name: str,
        host: str = "127.0.0.1",
        port: int | None = None,
        startup_timeout_s: float = 10.0,
        lifespan: Literal["on", "off"] = "on",
        keep_alive_s: int = DEFAULT_KEEP_ALIVE_S,
        sock: socket.socket | None = None,
    ) -> None:
        self.name = name
        self.host = host
        if sock is not None:  # a listening socket made by the caller (shared with other processes)
            host, port = sock.getsockname()[:2]
            self.host = host
        self.port = port or free_port(host)
        self._startup_timeout_s = startup_timeout_s
        config = uvicorn.Config(
            app,
            host=host,
            port=self.port,
            log_level="warning",
            lifespan=lifespan,
            timeout_keep_alive=keep_alive_s,
        )
        self._server = uvicorn.Server(config)
        thread_name = "gyre-" + name.removeprefix("the ").replace(" ", "-")
        sockets = None if sock is None else [sock]
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": sockets}, name=thread_name, daemon=True
        )

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> Self:
        self._thread.start()
        deadline = time.monotonic() + self._startup_timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self._server.should_exit = True
                raise ServerStartError(f"{self.name} did not start on {self.base_url}")
            time.sleep(0.01)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
