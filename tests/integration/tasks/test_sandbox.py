"""The sandbox kinds against a real host: what ``bwrap`` blocks (writes outside the workspace,
the run's environment, the host's network, fork bombs, CPU, memory and file size, processes left
behind) and what ``local`` does (a minimal environment, its process group killed on timeout).

The bwrap tests fail when bubblewrap is missing; ``GYRE_TEST_SKIP_BWRAP=1`` skips them instead.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gyre_train.exceptions import SandboxError
from gyre_train.sandbox import Bind, BwrapSandbox, Limits, LocalSandbox, bwrap_missing
from gyre_train.sandbox.users import LEASES, NOBODY, POOL_FIRST, POOL_SIZE
from tests.real_servers import require


@pytest.fixture
def area() -> Iterator[Path]:
    """A folder the sandbox's unprivileged user can reach (pytest's tmp_path is private)."""
    path = Path(tempfile.mkdtemp(prefix="gyre-sandbox-test-"))
    path.chmod(0o755)
    (path / "ws").mkdir()
    (path / "ws").chmod(0o755)
    (path / "ro").mkdir()
    (path / "ro" / "given.txt").write_text("read me\n")
    (path / "ro").chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def bwrap() -> BwrapSandbox:
    require("bwrap", bwrap_missing())
    return BwrapSandbox()


def _binds(area: Path) -> list[Bind]:
    return [Bind(area / "ws", "/app", writable=True), Bind(area / "ro", "/tests")]


PROBE_WRITES = """
import pathlib
for target in ["/app/ok.txt", "/tests/x.txt", "/usr/x.txt", "/etc/x.txt", "/x.txt", "/tmp/x.txt"]:
    try:
        pathlib.Path(target).write_text("x")
        print("wrote", target)
    except OSError as exc:
        print("refused", target, type(exc).__name__)
print("read", pathlib.Path("/tests/given.txt").read_text().strip())
"""


def test_bwrap_only_the_workspace_is_writable_on_the_host(bwrap: BwrapSandbox, area: Path) -> None:
    ran = bwrap.run(["python3", "-c", PROBE_WRITES], workdir="/app", binds=_binds(area), timeout_s=30)
    assert ran.exit_code == 0, ran.stderr
    lines = set(ran.stdout.splitlines())
    assert {"wrote /app/ok.txt", "wrote /tmp/x.txt", "read read me"} <= lines
    for target in ("/tests/x.txt", "/usr/x.txt", "/etc/x.txt", "/x.txt"):
        assert any(line.startswith(f"refused {target} ") for line in lines), ran.stdout
    assert (area / "ws" / "ok.txt").read_text() == "x"
    assert not (area / "ro" / "x.txt").exists() and not Path("/usr/x.txt").exists()
    assert not Path("/tmp/x.txt").exists()  # the sandbox's /tmp is its own


def test_bwrap_environment_is_built_from_nothing(
    bwrap: BwrapSandbox, area: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GYRE_DATABASE_URL", "postgresql://secret@127.0.0.1:5432/run")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    ran = bwrap.run(["env"], workdir="/app", binds=_binds(area), env={"TASK_VAR": "1"}, timeout_s=30)
    assert ran.exit_code == 0, ran.stderr
    keys = {line.split("=", 1)[0] for line in ran.stdout.splitlines()}
    assert keys == {"PATH", "HOME", "LANG", "TMPDIR", "TASK_VAR", "PWD"}  # bwrap sets PWD
    assert "secret" not in ran.stdout
    with pytest.raises(SandboxError, match="gyre's own settings"):
        bwrap.run(["env"], workdir="/app", binds=_binds(area), env={"GYRE_X": "1"}, timeout_s=30)


CONNECT = """
import socket, sys
for port in sys.argv[1:]:
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect(("127.0.0.1", int(port)))
        print("reached", port)
    except OSError as exc:
        print("blocked", port, type(exc).__name__)
"""


def test_bwrap_cannot_reach_the_hosts_network(bwrap: BwrapSandbox, area: Path) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        socket.create_connection(("127.0.0.1", port), timeout=3).close()  # reachable from the host
        ran = bwrap.run(
            ["python3", "-c", CONNECT, str(port), "5432"], workdir="/app", binds=_binds(area), timeout_s=30
        )
    assert ran.exit_code == 0, ran.stderr
    assert ran.stdout.split("\n")[:2] == [
        f"blocked {port} ConnectionRefusedError",
        "blocked 5432 ConnectionRefusedError",
    ]


SPAWN = """
import os, time
print("uid", os.getuid())
children = 0
try:
    for _ in range({n}):
        if os.fork() == 0:
            time.sleep({sleep})
            os._exit(0)
        children += 1
except OSError as exc:
    print("fork refused after", children, type(exc).__name__)
else:
    print("forked", children)
"""
FORK = SPAWN.format(n=200, sleep=5)


def test_bwrap_process_limit_stops_a_fork_bomb(bwrap: BwrapSandbox, area: Path) -> None:
    ran = bwrap.run(
        ["python3", "-c", FORK], workdir="/app", binds=_binds(area), timeout_s=60, limits=Limits(processes=20)
    )
    refused = ran.stdout.splitlines()[1]
    assert refused.startswith("fork refused after"), ran.stdout + ran.stderr
    assert int(refused.split()[3]) < 20


def test_bwrap_cpu_time_limit_kills_a_busy_loop(bwrap: BwrapSandbox, area: Path) -> None:
    ran = bwrap.run(
        ["python3", "-c", "while True: pass"],
        workdir="/app",
        binds=_binds(area),
        timeout_s=60,
        limits=Limits(cpu_s=1),
    )
    assert ran.exit_code != 0 and not ran.timed_out
    assert ran.seconds < 30


def test_bwrap_file_size_and_memory_limits(bwrap: BwrapSandbox, area: Path) -> None:
    write = "open('/app/big', 'wb').write(b'x' * (5 * 2**20))"
    ran = bwrap.run(
        ["python3", "-c", write],
        workdir="/app",
        binds=_binds(area),
        timeout_s=30,
        limits=Limits(file_size_mb=1),
    )
    assert ran.exit_code != 0
    assert (area / "ws" / "big").stat().st_size <= 2**20
    grab = "x = bytearray(800 * 2**20); print('allocated')"
    ran = bwrap.run(
        ["python3", "-c", grab],
        workdir="/app",
        binds=_binds(area),
        timeout_s=30,
        limits=Limits(memory_mb=256),
    )
    assert ran.exit_code != 0 and "MemoryError" in ran.stderr and "allocated" not in ran.stdout


LINGER = "sleep 600 & (sleep 3; echo late > {folder}/late.txt) & echo started; sleep 600"


def test_bwrap_timeout_kills_everything_it_started(bwrap: BwrapSandbox, area: Path) -> None:
    ran = bwrap.run(
        ["sh", "-c", LINGER.format(folder="/app")], workdir="/app", binds=_binds(area), timeout_s=1
    )
    assert ran.timed_out and ran.stdout.strip() == "started"
    time.sleep(4)
    assert not (area / "ws" / "late.txt").exists()


def test_bwrap_refuses_binds_its_user_cannot_read(bwrap: BwrapSandbox, area: Path, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("only bwrap started by root hands the sandbox to an unprivileged user")
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    with pytest.raises(SandboxError, match="not readable by the sandbox's user"):
        bwrap.run(["true"], workdir="/app", binds=[Bind(private, "/x")], timeout_s=5)


def test_local_environment_is_minimal(area: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GYRE_DATABASE_URL", "postgresql://secret@127.0.0.1:5432/run")
    ran = LocalSandbox().run(["env"], workdir=str(area / "ws"), timeout_s=30)
    assert ran.exit_code == 0, ran.stderr
    env = dict(line.split("=", 1) for line in ran.stdout.splitlines())
    assert set(env) == {"PATH", "HOME", "LANG", "TMPDIR"}
    assert env["HOME"] == str(area / "ws")


def test_local_timeout_kills_its_process_group(area: Path) -> None:
    folder = area / "ws"
    ran = LocalSandbox().run(["sh", "-c", LINGER.format(folder=folder)], workdir=str(folder), timeout_s=1)
    assert ran.timed_out and ran.stdout.strip() == "started"
    time.sleep(4)
    assert not (folder / "late.txt").exists()


def test_local_runs_in_the_workspace_and_cannot_move_folders(area: Path) -> None:
    ran = LocalSandbox().run(
        [sys.executable, "-c", "import os; print(os.getcwd())"], workdir=str(area / "ws"), timeout_s=30
    )
    assert ran.stdout.strip() == str(area / "ws")
    with pytest.raises(SandboxError, match="use the bwrap sandbox"):
        LocalSandbox().run(
            ["true"], workdir=str(area / "ws"), binds=[Bind(area / "ro", "/tests")], timeout_s=5
        )


HOLD = """
import os, pathlib, time
for _ in range({n}):
    if os.fork() == 0:
        time.sleep(30)
        os._exit(0)
pathlib.Path("/app/holding").write_text(str(os.getuid()))
time.sleep(30)
"""


def _beside_a_holder(sandbox: BwrapSandbox, area: Path) -> tuple[int, list[str]]:
    """The uid of a command of ``sandbox`` holding 12 children under a limit of 20 processes,
    and what a second command of it, started meanwhile under the same limit, prints forking
    12 children (its uid, then how far it got)."""
    (area / "ws2").mkdir()
    (area / "ws2").chmod(0o755)
    holder = Bind(area / "ws2", "/app", writable=True)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        held = pool.submit(
            sandbox.run,
            ["python3", "-c", HOLD.format(n=12)],
            workdir="/app",
            binds=[holder],
            timeout_s=8,
            limits=Limits(processes=20),
        )
        deadline = time.monotonic() + 20
        while not (area / "ws2" / "holding").exists():
            assert time.monotonic() < deadline and not held.done(), "the holder did not start"
            time.sleep(0.05)
        ran = sandbox.run(
            ["python3", "-c", SPAWN.format(n=12, sleep=2)],
            workdir="/app",
            binds=_binds(area),
            timeout_s=30,
            limits=Limits(processes=20),
        )
        assert held.result().timed_out  # it held its children until killed
    return int((area / "ws2" / "holding").read_text()), ran.stdout.split("\n")


def test_concurrent_bwrap_sandboxes_do_not_share_a_process_count(bwrap: BwrapSandbox, area: Path) -> None:
    # the holder's 13 processes take nothing from the other's 20: under root each command is a
    # user of its own; on any kernel since 5.14 its own user namespace also counts apart
    _, printed = _beside_a_holder(bwrap, area)
    assert printed[1] == "forked 12", printed


@pytest.mark.skipif(os.geteuid() != 0, reason="a user of its own per command needs root")
def test_concurrent_bwrap_commands_run_as_users_of_their_own_leased_and_given_back(
    bwrap: BwrapSandbox, area: Path
) -> None:
    holder_uid, printed = _beside_a_holder(bwrap, area)
    uid = int(printed[0].split()[1])
    pool = range(POOL_FIRST, POOL_FIRST + POOL_SIZE)
    assert holder_uid in pool and uid in pool and holder_uid != uid
    # each workspace was handed to its command's user, which the host knows by no name
    assert (area / "ws2").stat().st_uid == holder_uid and (area / "ws").stat().st_uid == uid
    assert not (LEASES / str(uid)).exists() and not (LEASES / str(holder_uid)).exists()  # given back
    fixed = BwrapSandbox(uid=NOBODY).run(
        ["python3", "-c", SPAWN.format(n=0, sleep=0)], workdir="/app", binds=_binds(area), timeout_s=30
    )
    assert fixed.stdout.split("\n")[0] == f"uid {NOBODY}"  # a uid given is used, unleased
