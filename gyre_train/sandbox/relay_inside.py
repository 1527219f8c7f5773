"""The in-sandbox end of the proxy route: listens on ``127.0.0.1:PORT`` in the sandbox's own
network namespace and forwards each connection, both ways, to the unix socket the host's
``UnixRelay`` serves. A standalone script (the standard library only, run by the host's
``/usr/bin/python3`` as the sandbox sees it); ``gyre_train.sandbox.relay`` imports its ``Pump``.

    python3 relay_inside.py PORT SOCKET WATCH_PID [NAME]

It listens, forks and returns 0 (1 with a message on stderr when it cannot listen or no socket
is at SOCKET): a command started after it may connect at once. The child serves until process
WATCH_PID is gone; NAME only marks the process for ``ps``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import selectors
import socket
import stat
import sys
from collections.abc import Callable

CHUNK = 64 * 1024
HIGH_WATER = 256 * 1024  # buffered bytes for one direction before its source is no longer read
BACKLOG = 1024
WATCH_EVERY_S = 1.0


class _End:
    """One socket of a forwarded pair: ``out`` waits to be written to it; ``eof``: it sent its
    last byte; ``shut``: it was told so about its peer."""

    __slots__ = ("connecting", "eof", "out", "peer", "shut", "sock")

    def __init__(self, sock: socket.socket, *, connecting: bool) -> None:
        self.sock = sock
        self.connecting = connecting
        self.out = bytearray()
        self.eof = False
        self.shut = False
        self.peer: _End = self


class Pump:
    """Accepts connections on ``listener`` and forwards each to a socket from ``connect`` (a
    non-blocking socket whose connect was started), both ways, in one selector loop: many
    long-lived streams at once, in one thread, with no thread per connection. A half-close is
    passed on; a reset on either side closes both."""

    def __init__(self, listener: socket.socket, connect: Callable[[], socket.socket]) -> None:
        listener.setblocking(False)
        self._listener = listener
        self._connect = connect
        self._selector = selectors.DefaultSelector()
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._wake_write.setblocking(False)
        self._selector.register(listener, selectors.EVENT_READ, "accept")
        self._selector.register(self._wake_read, selectors.EVENT_READ, "wake")
        self._stopping = False
        self._ends: set[_End] = set()  # a socket may be out of the selector, waiting on its peer

    def stop(self) -> None:
        """Make ``serve`` return soon; callable from any thread."""
        self._stopping = True
        with contextlib.suppress(OSError):  # full (a wake-up is pending anyway) or already closed
            self._wake_write.send(b"x")

    def serve(self, keep_going: Callable[[], bool] = lambda: True) -> None:
        """Forward until ``stop`` or until ``keep_going`` (asked about once a second) says no;
        then close every socket, the listener's included."""
        try:
            while not self._stopping and keep_going():
                for key, mask in self._selector.select(timeout=WATCH_EVERY_S):
                    if key.data == "accept":
                        self._accept()
                    elif key.data == "wake":
                        self._drain_wake()
                    elif key.data in self._ends:  # else closed with its peer, earlier in this batch
                        self._service(key.data, mask)
        finally:
            for end in self._ends:
                end.sock.close()
            self._listener.close()
            self._wake_read.close()
            self._wake_write.close()
            self._selector.close()

    def _drain_wake(self) -> None:
        try:
            while self._wake_read.recv(CHUNK):
                pass
        except OSError:
            pass

    def _accept(self) -> None:
        for _ in range(64):  # a burst at a time; the loop comes back for more
            try:
                client, _address = self._listener.accept()
            except OSError:  # none left (EAGAIN), or out of descriptors: retried on the next event
                return
            client.setblocking(False)
            if client.family in (socket.AF_INET, socket.AF_INET6):
                # streamed tokens: no Nagle delay (40 ms a small write, with the peer's delayed ack)
                client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                upstream = self._connect()
            except OSError:
                client.close()  # the client sees its connection closed at once
                continue
            near, far = _End(client, connecting=False), _End(upstream, connecting=True)
            near.peer, far.peer = far, near
            self._ends.update((near, far))
            self._watch(near)
            self._watch(far)

    def _service(self, end: _End, mask: int) -> None:
        try:
            if end.connecting:
                if mask & selectors.EVENT_WRITE:
                    if error := end.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                        raise OSError(error, os.strerror(error))
                    end.connecting = False
            else:
                if mask & selectors.EVENT_READ:
                    data = end.sock.recv(CHUNK)
                    if data:
                        end.peer.out += data
                    else:
                        end.eof = True
                if mask & selectors.EVENT_WRITE and end.out:
                    del end.out[: end.sock.send(end.out)]
            for side in (end, end.peer):
                # pass a half-close on once everything sent before it was delivered
                if side.peer.eof and not side.out and not side.shut and not side.connecting:
                    side.sock.shutdown(socket.SHUT_WR)
                    side.shut = True
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:  # a reset, a refused connect: the pair is over
            self._close(end)
            return
        if end.shut and end.peer.shut:
            self._close(end)
            return
        self._watch(end)
        self._watch(end.peer)

    def _watch(self, end: _End) -> None:
        if end.connecting:
            events = selectors.EVENT_WRITE
        else:
            events = selectors.EVENT_WRITE if end.out else 0
            if not end.eof and len(end.peer.out) < HIGH_WATER:
                events |= selectors.EVENT_READ
        registered = end.sock in self._selector.get_map()
        if events and registered:
            self._selector.modify(end.sock, events, end)
        elif events:
            self._selector.register(end.sock, events, end)
        elif registered:
            self._selector.unregister(end.sock)

    def _close(self, end: _End) -> None:
        for side in (end, end.peer):
            if side not in self._ends:
                continue
            if side.sock in self._selector.get_map():
                self._selector.unregister(side.sock)
            side.sock.close()
            self._ends.discard(side)


def connect_unix(path: str) -> socket.socket:
    """A non-blocking unix socket connecting to ``path`` (raises OSError when it cannot)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    error = sock.connect_ex(path)
    if error not in (0, errno.EINPROGRESS):  # EAGAIN: the host's backlog is full
        sock.close()
        raise OSError(error, os.strerror(error))
    return sock


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a process of another user took the number: ours is gone
        return False
    return True


def main(argv: list[str]) -> int:
    if len(argv) not in (4, 5) or not argv[1].isdigit() or not argv[3].isdigit():
        print(f"usage: {argv[0]} PORT SOCKET WATCH_PID [NAME]", file=sys.stderr)
        return 2
    port, path, watch = int(argv[1]), argv[2], int(argv[3])
    try:
        is_socket = stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        is_socket = False
    if not is_socket:
        print(f"gyre: no proxy relay socket at {path}: the route to the proxy is not served", file=sys.stderr)
        return 1
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(BACKLOG)
    except OSError as exc:
        print(f"gyre: the proxy route cannot listen on 127.0.0.1:{port}: {exc.strerror}", file=sys.stderr)
        return 1
    if os.fork() != 0:
        return 0  # the port is listening: connections queue until the child accepts them
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)  # the command's stdout is its own; stderr stays for a failure's message
    os.close(null)
    Pump(listener, lambda: connect_unix(path)).serve(lambda: _alive(watch))
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
