"""The proxy route against real sockets: ``UnixRelay`` (many concurrent streams, big bodies, a
peer closing early, a half-close) and a prepared ``bwrap`` process that reaches an HTTP server
on the host through it (concurrent slow streamed answers), and nothing else of the host: not
another host port, not PostgreSQL's. Killing the process group leaves nothing behind.

The bwrap tests fail when bubblewrap is missing; ``GYRE_TEST_SKIP_BWRAP=1`` skips them instead.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gyre_train.exceptions import SandboxError
from gyre_train.sandbox import Bind, BwrapSandbox, Limits, LocalSandbox, Prepared, ProxyRoute, bwrap_missing
from gyre_train.sandbox.relay import FORWARDER, UnixRelay
from tests.real_servers import require

CHUNKS = 5
BIG = 8 * 2**20


class ProxyHandler(http.server.BaseHTTPRequestHandler):
    """``/plain``: a short body; ``/stream``: CHUNKS chunks, slowly, chunked; ``/big``: BIG bytes."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if self.path == "/stream":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for index in range(CHUNKS):
                data = f"chunk {index}\n".encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()
                time.sleep(0.2)
            self.wfile.write(b"0\r\n\r\n")
            return
        body = b"x" * BIG if self.path == "/big" else b"plain answer"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return


STREAMED = "".join(f"chunk {i}\n" for i in range(CHUNKS))


@pytest.fixture
def proxy() -> Iterator[int]:
    """An HTTP server on the host's 127.0.0.1 standing in for the model proxy; its port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), ProxyHandler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture
def area() -> Iterator[Path]:
    """A folder the sandbox's unprivileged user can reach: ``ws`` (the workspace), ``relay``."""
    path = Path(tempfile.mkdtemp(prefix="gyre-route-test-"))
    for folder in (path, path / "ws", path / "relay"):
        folder.mkdir(exist_ok=True)
        folder.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def relay(area: Path, proxy: int) -> Iterator[UnixRelay]:
    with UnixRelay(area / "relay" / "proxy.sock", "127.0.0.1", proxy) as running:
        yield running


def _ask(path: Path, request: bytes, *, half_close: bool = False) -> bytes:
    """Send ``request`` over the unix socket ``path``; everything that comes back until EOF."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(str(path))
        sock.sendall(request)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        parts = []
        while data := sock.recv(65536):
            parts.append(data)
    return b"".join(parts)


def _get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: proxy\r\nConnection: close\r\n\r\n".encode()


def test_relay_forwards_many_concurrent_streams(relay: UnixRelay) -> None:
    with ThreadPoolExecutor(max_workers=40) as pool:
        answers = list(pool.map(lambda _: _ask(relay.socket_path, _get("/stream")), range(40)))
    for answer in answers:
        assert answer.startswith(b"HTTP/1.1 200")
        for index in range(CHUNKS):
            assert f"chunk {index}\n".encode() in answer
        assert answer.endswith(b"0\r\n\r\n")


def test_relay_passes_big_bodies_both_ways_and_a_half_close(relay: UnixRelay) -> None:
    with ThreadPoolExecutor(max_workers=4) as pool:
        answers = list(pool.map(lambda _: _ask(relay.socket_path, _get("/big")), range(4)))
    for answer in answers:
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and body == b"x" * BIG
    # the client is done sending: the server still gets the whole request, the client the answer
    answer = _ask(relay.socket_path, _get("/plain"), half_close=True)
    assert answer.endswith(b"\r\n\r\nplain answer")


def test_relay_outlives_peers_that_close_early(relay: UnixRelay, area: Path) -> None:
    for _ in range(20):  # clients that leave in the middle of a streamed answer
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(30)
            sock.connect(str(relay.socket_path))
            sock.sendall(_get("/stream"))
            assert sock.recv(16).startswith(b"HTTP/1.1")
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        dead_port = closed.getsockname()[1]
    with UnixRelay(area / "relay" / "dead.sock", "127.0.0.1", dead_port) as dead:
        try:  # the target refused: the relay closes the client's connection at once
            answer = _ask(dead.socket_path, _get("/plain"))
        except (BrokenPipeError, ConnectionResetError):  # closed before the request was sent
            answer = b""
        assert answer == b""
    assert _ask(relay.socket_path, _get("/plain")).endswith(b"plain answer")


def test_relay_socket_is_open_to_all_and_removed_on_close(area: Path, proxy: int) -> None:
    path = area / "relay" / "own.sock"
    relay = UnixRelay(path, "127.0.0.1", proxy)
    relay.start()
    try:
        assert path.stat().st_mode & 0o777 == 0o666
        with pytest.raises(SandboxError, match="served by another relay"):
            UnixRelay(path, "127.0.0.1", proxy).start()
    finally:
        relay.close()
    assert not path.exists()
    relay.close()  # a second close does nothing
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stale:  # left by a relay that died
        stale.bind(str(path))
    with UnixRelay(path, "127.0.0.1", proxy):
        assert _ask(path, _get("/plain")).endswith(b"plain answer")
    path.write_text("not a socket")
    with pytest.raises(SandboxError, match="not a socket"):
        UnixRelay(path, "127.0.0.1", proxy).start()
    with pytest.raises(SandboxError, match="longer than"):
        UnixRelay(area / ("x" * 120), "127.0.0.1", proxy)


# ---- a prepared bwrap process with the route


@pytest.fixture
def bwrap() -> BwrapSandbox:
    require("bwrap", bwrap_missing())
    return BwrapSandbox()


def _unique() -> str:
    return f"route-test-{uuid.uuid4().hex[:12]}"


def start_prepared(prepared: Prepared) -> subprocess.Popen[bytes]:
    """Start ``prepared`` the way a harness is started: exactly its env, a group of its own."""
    return subprocess.Popen(
        list(prepared.argv),
        env=dict(prepared.env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def lines_until(proc: subprocess.Popen[bytes], last: str, timeout_s: float = 120) -> list[str]:
    """stdout lines up to one equal to ``last``; fails with stderr when it does not come."""
    assert proc.stdout is not None and proc.stderr is not None
    lines: list[str] = []
    buffered = b""
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not selector.select(timeout=1):
                continue
            data = os.read(proc.stdout.fileno(), 65536)
            if not data:
                break
            buffered += data
            *complete, buffered = buffered.split(b"\n")
            lines += [line.decode() for line in complete]
            if last in lines:
                return lines
    stop_prepared(proc, Prepared((), {}))
    pytest.fail(f"no {last!r} line; stdout {lines}, stderr {proc.stderr.read().decode()[-2000:]}")


def stop_prepared(proc: subprocess.Popen[bytes], prepared: Prepared) -> None:
    """What a caller does at the end: kill the group, wait, clean up."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
    prepared.cleanup()


def running_with(marker: str) -> list[str]:
    """Command lines of the host's processes that name ``marker`` (this test's own excluded)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile
            continue
        if marker in line:
            found.append(f"{entry.name}: {line.strip()}")
    return found


def left_behind(marker: str) -> list[str]:
    """``running_with(marker)`` once the kernel had a moment to tear a namespace down; what is
    still there is killed, so that a failing test leaves nothing running."""
    for _ in range(50):
        if not (left := running_with(marker)):
            return []
        time.sleep(0.1)
    for line in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(line.split(":", 1)[0]), signal.SIGKILL)
    return left


ASK_CONCURRENTLY = """
import json, socket, sys, threading, urllib.request
port, others = int(sys.argv[1]), [int(p) for p in sys.argv[2].split(",")]
answers = {}
def fetch(key, path):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as answer:
            answers[key] = answer.read().decode()
    except OSError as exc:
        answers[key] = f"failed: {exc}"
threads = [threading.Thread(target=fetch, args=(f"{p}{i}", f"/{p}")) for i in range(4) for p in ("stream", "plain")]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps(answers), flush=True)
reached = {}
for other in others:
    try:
        socket.create_connection(("127.0.0.1", other), timeout=3).close()
        reached[other] = "reached"
    except OSError as exc:
        reached[other] = type(exc).__name__
print(json.dumps(reached), flush=True)
print("done", flush=True)
import time; time.sleep(600)
"""


def test_bwrap_route_reaches_the_proxy_and_nothing_else(
    bwrap: BwrapSandbox, relay: UnixRelay, proxy: int, area: Path
) -> None:
    name = _unique()
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        other_port = other.getsockname()[1]
        socket.create_connection(("127.0.0.1", other_port), timeout=3).close()  # the host reaches it
        prepared = bwrap.prepare(
            ["python3", "-c", ASK_CONCURRENTLY, str(proxy), f"{other_port},5432", name],
            workdir="/app",
            name=name,
            binds=[Bind(area / "ws", "/app", writable=True)],
            limits=Limits(processes=64),
            route=ProxyRoute(relay.socket_path, proxy),
        )
        proc = start_prepared(prepared)
        try:
            lines = lines_until(proc, "done")
            named = running_with(name)
            assert any(FORWARDER in line for line in named), named  # the check below can fail
        finally:
            stop_prepared(proc, prepared)
    answers, reached = json.loads(lines[0]), json.loads(lines[1])
    assert answers == {f"stream{i}": STREAMED for i in range(4)} | {
        f"plain{i}": "plain answer" for i in range(4)
    }
    assert reached == {str(other_port): "ConnectionRefusedError", "5432": "ConnectionRefusedError"}
    assert left_behind(name) == []  # neither the command nor its forwarder


def test_bwrap_route_ends_with_a_command_that_ends(
    bwrap: BwrapSandbox, relay: UnixRelay, proxy: int, area: Path
) -> None:
    name = _unique()
    prepared = bwrap.prepare(
        ["python3", "-c", "print('bye')", name],
        workdir="/app",
        name=name,
        binds=[Bind(area / "ws", "/app", writable=True)],
        route=ProxyRoute(relay.socket_path, proxy),
    )
    proc = start_prepared(prepared)
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out) == (0, b"bye\n"), err
    assert left_behind(name) == []


def test_bwrap_route_needs_a_served_socket(bwrap: BwrapSandbox, area: Path) -> None:
    with pytest.raises(SandboxError, match="start its relay"):
        bwrap.prepare(
            ["true"],
            workdir="/app",
            name=_unique(),
            binds=[Bind(area / "ws", "/app", writable=True)],
            route=ProxyRoute(area / "relay" / "proxy.sock", 8000),
        )


def test_bwrap_route_fails_clearly_when_the_relay_is_gone(
    bwrap: BwrapSandbox, area: Path, proxy: int
) -> None:
    name = _unique()
    with UnixRelay(area / "relay" / "gone.sock", "127.0.0.1", proxy) as relay:
        prepared = bwrap.prepare(
            ["python3", "-c", "print('started')", name],
            workdir="/app",
            name=name,
            binds=[Bind(area / "ws", "/app", writable=True)],
            route=ProxyRoute(relay.socket_path, proxy),
        )
    proc = start_prepared(prepared)  # the relay closed (and removed its socket) meanwhile
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and out == b""
    assert b"gyre: no proxy relay socket at /run/gyre/gone.sock" in err


def test_bwrap_prepare_without_a_route_has_no_network(bwrap: BwrapSandbox, proxy: int, area: Path) -> None:
    name = _unique()
    prepared = bwrap.prepare(
        ["python3", "-c", ASK_CONCURRENTLY, str(proxy), "5432", name],
        workdir="/app",
        name=name,
        binds=[Bind(area / "ws", "/app", writable=True)],
    )
    proc = start_prepared(prepared)
    try:
        lines = lines_until(proc, "done")
    finally:
        stop_prepared(proc, prepared)
    assert all(answer.startswith("failed:") for answer in json.loads(lines[0]).values())
    assert left_behind(name) == []


def test_local_prepare_runs_in_its_folder_with_a_minimal_env(
    area: Path, proxy: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GYRE_DATABASE_URL", "postgresql://secret@127.0.0.1:5432/x")
    folder = area / "ws"
    show = "import json, os; print(json.dumps([os.getcwd(), sorted(os.environ)]))"
    prepared = LocalSandbox().prepare(
        [sys.executable, "-c", show],
        workdir=str(folder),
        name=_unique(),
        env={"TASK_VAR": "1"},
        route=ProxyRoute(area / "relay" / "unused.sock", proxy),
    )
    assert "GYRE_DATABASE_URL" not in prepared.env
    done = subprocess.run(
        list(prepared.argv), env=dict(prepared.env), cwd="/", capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    cwd, keys = json.loads(done.stdout)
    assert cwd == str(folder)
    assert set(keys) == {"PATH", "HOME", "LANG", "TMPDIR", "TASK_VAR"}
    with pytest.raises(SandboxError, match="use the bwrap sandbox"):
        LocalSandbox().prepare(["true"], workdir=str(folder), name="x", binds=[Bind(area, "/elsewhere")])
