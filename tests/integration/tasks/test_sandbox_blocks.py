"""What each sandbox kind blocks, shown by a hostile agent (``tests/fixtures/blocks/agent.py``)
run the way a harness runs: ``prepare`` with a route to a stand-in proxy, started in a process
group of its own with exactly the prepared environment, its group killed, its cleanup called.

The agent first says which user it runs as (not root, no capabilities, under a confined kind),
then tries six things: (a) to read the run's database URL and an API key from the
caller's environment, (b) to write outside its workspace, (c) to reach PostgreSQL's port and a
port on another address of the host, (d) to fork past the process limit, (e) to write twice the
file-size limit, then more than the disk cap in files each under that limit, (f) to leave a
process running (``setsid nohup``) after it is killed; and last to reach the proxy through the
route. One agent run per kind serves every test of that kind; each test asserts one attempt. The
confined kinds must block all six, and after the cleanup every byte the agent wrote in its
workspace is there on the host; ``local`` blocks only (a), and per file (e), and the tests below
say so.

The confined kinds are bwrap, podman and docker (the Docker Engine API of podman's own
service, started here as in ``test_containers``). Each fails when missing;
``GYRE_TEST_SKIP_BWRAP=1`` and ``GYRE_TEST_SKIP_PODMAN=1`` skip them instead.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gyre_train.sandbox import Bind, Limits, ProxyRoute, Sandbox, bwrap_missing, sandbox_for
from gyre_train.sandbox.docker import DockerSandbox
from gyre_train.sandbox.relay import UnixRelay
from gyre_train.sandbox.users import POOL_FIRST, POOL_SIZE
from tests.integration.tasks.test_containers import docker_url, podman  # noqa: F401 (fixtures)
from tests.integration.tasks.test_sandbox_route import (
    ProxyHandler,
    left_behind,
    lines_until,
    running_with,
    start_prepared,
    stop_prepared,
)
from tests.real_servers import require

AGENT = Path(__file__).resolve().parents[2] / "fixtures" / "blocks" / "agent.py"
SECRET_URL = "postgresql://secret@127.0.0.1:5432/x"
FAKE_KEY = "sk-gyre-fake-key-0123456789abcdef"
LIMIT_MB = 8
LIMIT = LIMIT_MB * 2**20
DISK_MB = 3 * LIMIT_MB  # the workspace's total (Limits.disk_mb): the file of LIMIT, then spills
DISK = DISK_MB * 2**20
SPILL_FILES = 12  # the workspace's spill: DISK bytes in files of DISK / 12 each, under LIMIT
PROCESSES = 64
WORKDIR = "/app"
# The kinds that must block every attempt. A container kind joins by passing these tests.
CONFINED = ["bwrap", "podman", "docker"]
TMP_CAPPED = {"bwrap", "podman", "docker"}  # kinds whose /tmp is a tmpfs no larger than the file-size limit
SYSTEM_PATHS = ("/etc", "/root", "/usr")


def host_address() -> str | None:
    """An IPv4 address of this host other than loopback, or None when it has none."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(
            ["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True, timeout=10
        )
        for line in done.stdout.splitlines():
            parts = line.split()
            if "inet" in parts:
                return parts[parts.index("inet") + 1].split("/")[0]
    with contextlib.suppress(OSError):
        address = socket.gethostbyname(socket.gethostname())
        if not address.startswith("127."):
            return address
    return None


@dataclass(frozen=True)
class Outcome:
    """One agent run: its reports by attempt, and what the host saw."""

    kind: str
    name: str
    reports: dict[str, dict[str, Any]]
    lingering_before_kill: list[str]  # the escaped process, seen while the agent ran
    left_after_kill: list[str]  # processes naming this run once its group was killed
    host_files: dict[str, bool]  # outside-the-workspace targets (host paths): do they exist?
    workspace: dict[str, int]  # the workspace's files on the host after the cleanup: their sizes
    owners: set[int]  # the uids owning those files on the host
    still_mounted: bool  # is the workspace still a mount point after the cleanup?
    other_port: int
    outside: str | None  # "address:port" of a listener on the host's other address


@dataclass(frozen=True)
class Stage:
    """The host side shared by every run of this module."""

    root: Path
    proxy_port: int
    relay: UnixRelay
    other_port: int  # a listener on the host's 127.0.0.1
    outside: str | None  # a listener on another address of the host, as "address:port"


@pytest.fixture(scope="module")
def stage() -> Iterator[Stage]:
    root = Path(tempfile.mkdtemp(prefix="gyre-blocks-test-"))
    root.chmod(0o755)
    (root / "relay").mkdir(mode=0o755)
    (root / "agent").mkdir(mode=0o755)
    shutil.copy(AGENT, root / "agent" / "agent.py")
    (root / "agent" / "agent.py").chmod(0o644)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), ProxyHandler)
    server.daemon_threads = True
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    proxy_port = server.server_address[1]
    address = host_address()
    with contextlib.ExitStack() as stack:
        relay = stack.enter_context(UnixRelay(root / "relay" / "proxy.sock", "127.0.0.1", proxy_port))
        other = stack.enter_context(socket.socket())
        other.bind(("127.0.0.1", 0))
        other.listen()
        outside = None
        if address is not None:
            far = stack.enter_context(socket.socket())
            far.bind((address, 0))
            far.listen()
            outside = f"{address}:{far.getsockname()[1]}"
            socket.create_connection(
                (address, far.getsockname()[1]), timeout=3
            ).close()  # the host reaches it
        yield Stage(root, proxy_port, relay, other.getsockname()[1], outside)
    server.shutdown()
    server.server_close()
    serving.join()
    shutil.rmtree(root, ignore_errors=True)


def _targets(stage: Stage) -> list[list[Any]]:
    targets: list[list[Any]] = [["127.0.0.1", 5432], ["127.0.0.1", stage.other_port]]
    if stage.outside is not None:
        host, port = stage.outside.rsplit(":", 1)
        targets.append([host, int(port)])
    return targets


def _run(
    stage: Stage, sandbox: Sandbox, plan: dict[str, Any], *, confined: bool, outside: list[Path]
) -> Outcome:
    """Run the agent with ``plan`` under ``sandbox`` the way a harness runs; kill it; look."""
    name = f"blocks-{sandbox.kind}-{uuid.uuid4().hex[:10]}"
    case = stage.root / name
    workspace, launcher = case / "ws", case / "launcher"
    for folder in (case, workspace, workspace / "spill", launcher):
        folder.mkdir()
        folder.chmod(0o755)
    plan = plan | {"linger": f"linger-{name}"}
    plan["writes"] = [w.replace("{name}", name).replace("{case}", str(case)) for w in plan["writes"]]
    if confined:
        workdir = WORKDIR
        binds = [Bind(workspace, WORKDIR, writable=True), Bind(stage.root / "agent", "/agent")]
        script = "/agent/agent.py"
    else:
        workdir, binds, script = str(workspace), [], str(stage.root / "agent" / "agent.py")
    limits = Limits(processes=PROCESSES, file_size_mb=LIMIT_MB, disk_mb=DISK_MB if confined else None)
    with pytest.MonkeyPatch.context() as patch:  # the caller's environment holds the run's secrets
        patch.setenv("GYRE_DATABASE_URL", SECRET_URL)
        patch.setenv("OPENAI_API_KEY", FAKE_KEY)
        prepared = sandbox.prepare(
            [sandbox.python, script, json.dumps(plan), name],
            workdir=workdir,
            name=name,
            binds=binds,
            limits=limits,
            route=ProxyRoute(stage.relay.socket_path, stage.proxy_port),
        )
        proc = start_prepared(prepared)
    try:
        lines = lines_until(proc, json.dumps({"attempt": "done"}), timeout_s=180)
        lingering = []
        for _ in range(100):  # setsid forks, then nohup execs python: give it a moment
            if lingering := running_with(plan["linger"]):
                break
            time.sleep(0.1)
    finally:
        stop_prepared(proc, prepared)
    left = left_behind(name)  # the escaped process names the run too
    reports = {r["attempt"]: r for r in map(json.loads, lines) if r["attempt"] != "done"}
    host_files = {
        str(p).replace("{name}", name): Path(str(p).replace("{name}", name)).exists() for p in outside
    }
    host_files[str(launcher / name)] = (launcher / name).exists()
    written = [p for p in workspace.rglob("*") if p.is_file()]
    files = {p.relative_to(workspace).as_posix(): p.stat().st_size for p in written}
    return Outcome(
        sandbox.kind,
        name,
        reports,
        lingering,
        left,
        host_files,
        files,
        {p.stat().st_uid for p in written},
        workspace.is_mount(),
        stage.other_port,
        stage.outside,
    )


@pytest.fixture(scope="module", params=CONFINED)
def confined(request: pytest.FixtureRequest, stage: Stage) -> Outcome:
    """The agent's every attempt under a confined kind."""
    kind: str = request.param
    sandbox: Sandbox
    if kind == "bwrap":
        require("bwrap", bwrap_missing())
        sandbox = sandbox_for(kind)
    elif kind == "podman":
        sandbox = request.getfixturevalue("podman")
    else:  # the Docker Engine API of podman's own service, started for this module
        request.getfixturevalue("podman")
        sandbox = DockerSandbox(base_url=request.getfixturevalue("docker_url"))
    plan = {
        "user": True,
        "secrets": [SECRET_URL.encode().hex(), FAKE_KEY.encode().hex()],
        "writes": [
            f"{WORKDIR}/inside.txt",
            *(f"{p}/gyre-blocks-{{name}}" for p in SYSTEM_PATHS),
            "../launcher/{name}",  # the launcher's folder beside the workspace, by a relative path
            "{case}/launcher/{name}",  # ... and by its host path
        ],
        "connect": _targets(stage),
        "fork": {"max": 200, "seconds": 3},
        "disk": {
            "file": f"{WORKDIR}/big",
            "bytes": 2 * LIMIT,
            "spill": ["/tmp", f"{WORKDIR}/spill"],
            "spill_bytes": DISK,  # /tmp: 12 files of 2 MiB; the workspace: 12 more, beyond its cap
            "spill_files": SPILL_FILES,
        },
        "route": f"http://127.0.0.1:{stage.proxy_port}/plain",
    }
    outside = [Path(p, "gyre-blocks-{name}") for p in SYSTEM_PATHS]
    return _run(stage, sandbox, plan, confined=True, outside=outside)


@pytest.fixture(scope="module")
def local(stage: Stage) -> Outcome:
    """The agent under ``local``, without the fork bomb (as root no process limit applies: it
    would reach the host) and writing only inside the test's own folder."""
    plan = {
        "user": True,
        "secrets": [SECRET_URL.encode().hex(), FAKE_KEY.encode().hex()],
        "writes": ["inside.txt", "../launcher/{name}"],
        "connect": _targets(stage),
        "disk": {"file": "big", "bytes": 2 * LIMIT, "spill": ["spill"], "spill_bytes": 2 * LIMIT},
        "route": f"http://127.0.0.1:{stage.proxy_port}/plain",
    }
    return _run(stage, sandbox_for("local"), plan, confined=False, outside=[])


# ---- the confined kinds: each attempt blocked


def test_the_agent_is_not_root_and_has_no_capabilities(confined: Outcome) -> None:
    """Started by root, every confined kind runs the agent as a user leased from the pool (bwrap,
    and a prepared container's ``--user``; by another user, as that user), with no capability,
    effective or in its bounding set (``--cap-drop all``)."""
    user = confined.reports["user"]
    assert 0 not in (user["uid"], user["euid"], user["gid"], *user["groups"]), user
    assert user["uid"] == user["euid"] == user["gid"], user
    if os.geteuid() == 0:
        assert user["uid"] in range(POOL_FIRST, POOL_FIRST + POOL_SIZE), user
    else:
        assert user["uid"] == os.geteuid(), user
    assert (user["cap_eff"], user["cap_bnd"]) == (0, 0), user  # none held, none to be gained


def test_the_agents_files_are_its_users_on_the_host(confined: Outcome) -> None:
    """The files it wrote in the workspace are owned on the host by the user it ran as (no user
    namespace maps it to another), which root, the evaluator, reads and writes."""
    assert confined.owners == {confined.reports["user"]["uid"]}, confined.owners


def test_a_secrets_of_the_caller_are_not_visible(confined: Outcome) -> None:
    env = confined.reports["env"]
    assert env["secrets_in_env"] == [] and env["secrets_in_proc"] == []
    allowed = {"PATH", "HOME", "LANG", "TMPDIR", "PWD"}
    if confined.kind in ("podman", "docker"):
        allowed.add("HOSTNAME")  # the container's own name, set by the engine
    if confined.kind == "docker":  # podman's service adds its defaults, which no API call removes
        allowed |= {"TERM", "container"}
    assert set(env["keys"]) <= allowed, env["keys"]


def test_b_writes_outside_the_workspace_fail(confined: Outcome) -> None:
    outcome = confined.reports["writes"]["outcome"]
    assert outcome[f"{WORKDIR}/inside.txt"] == "wrote"  # the workspace itself is writable
    outside = {path: how for path, how in outcome.items() if not path.startswith(WORKDIR)}
    assert len(outside) == 5 and "wrote" not in outside.values(), outside
    assert not any(confined.host_files.values()), confined.host_files


def test_c_the_hosts_network_is_unreachable(confined: Outcome) -> None:
    outcome = confined.reports["connect"]["outcome"]
    assert outcome["127.0.0.1:5432"] != "reached"
    assert outcome[f"127.0.0.1:{confined.other_port}"] != "reached"


def test_c_another_address_of_the_host_is_unreachable(confined: Outcome) -> None:
    if confined.outside is None:
        pytest.skip("this host has no IPv4 address but loopback: nothing else to reach")
    assert confined.reports["connect"]["outcome"][confined.outside] != "reached"


def test_d_a_fork_bomb_stops_at_the_process_limit(confined: Outcome) -> None:
    fork = confined.reports["fork"]
    assert fork["refused"] == "EAGAIN" and fork["forked"] < PROCESSES, fork
    assert "route" in confined.reports  # the agent went on after the bomb: the sandbox survived


def test_e_a_file_stops_at_the_size_limit(confined: Outcome) -> None:
    disk = confined.reports["disk"]
    assert (disk["file_refused"], disk["file_bytes"]) == ("EFBIG", LIMIT), disk


def test_e_tmp_is_capped_at_the_size_limit(confined: Outcome) -> None:
    if confined.kind not in TMP_CAPPED:
        pytest.skip(f"{confined.kind} does not cap /tmp")
    tmp = confined.reports["disk"]["spill"]["/tmp"]
    assert tmp["refused"] == "ENOSPC" and tmp["bytes"] <= LIMIT, tmp


def test_e_the_workspace_total_stops_at_the_disk_cap(confined: Outcome) -> None:
    """Files each under the file-size limit, together past the cap: a write fails with ENOSPC
    (not EFBIG), the workspace holds no more than the cap, and the agent goes on."""
    assert DISK // SPILL_FILES < LIMIT  # each spill file is allowed by the file-size limit
    disk = confined.reports["disk"]
    spill = disk["spill"][f"{WORKDIR}/spill"]
    assert spill["refused"] == "ENOSPC" and spill["bytes"] < DISK, spill
    assert disk["file_bytes"] + spill["bytes"] <= DISK, disk
    assert "linger" in confined.reports and "route" in confined.reports  # it went on


def test_e_what_was_written_in_the_capped_workspace_is_kept(confined: Outcome) -> None:
    """After the cleanup the host's workspace holds every byte the agent reported writing, at
    the same path, and no mount is left over it."""
    disk = confined.reports["disk"]
    files = confined.workspace
    assert not confined.still_mounted
    assert files["big"] == disk["file_bytes"] and files["inside.txt"] == len("escaped\n"), files
    spilled = sum(size for path, size in files.items() if path.startswith("spill/"))
    assert spilled == disk["spill"][f"{WORKDIR}/spill"]["bytes"] > 0, files


def test_f_nothing_outlives_the_killed_group(confined: Outcome) -> None:
    assert confined.lingering_before_kill, "the escape attempt did not start"
    assert confined.left_after_kill == []


def test_the_route_to_the_proxy_still_works(confined: Outcome) -> None:
    assert confined.reports["route"] == {"attempt": "route", "body": "plain answer"}


# ---- local: what it does not block


def test_local_runs_as_the_callers_own_user(local: Outcome) -> None:
    user = local.reports["user"]
    assert (user["uid"], user["euid"]) == (os.geteuid(), os.geteuid()), user


def test_local_hides_the_callers_environment(local: Outcome) -> None:
    env = local.reports["env"]
    assert env["secrets_in_env"] == []
    assert set(env["keys"]) <= {"PATH", "HOME", "LANG", "TMPDIR", "PWD"}, env["keys"]


def test_local_does_not_block_writes_outside_the_workspace(local: Outcome) -> None:
    outcome = local.reports["writes"]["outcome"]
    assert outcome == {"inside.txt": "wrote", f"../launcher/{local.name}": "wrote"}
    assert all(local.host_files.values()), local.host_files


def test_local_does_not_block_the_hosts_network(local: Outcome) -> None:
    outcome = local.reports["connect"]["outcome"]
    assert outcome[f"127.0.0.1:{local.other_port}"] == "reached"
    if local.outside is not None:
        assert outcome[local.outside] == "reached"


def test_local_limits_file_size_but_not_the_total(local: Outcome) -> None:
    disk = local.reports["disk"]
    assert (disk["file_refused"], disk["file_bytes"]) == ("EFBIG", LIMIT), disk
    assert disk["spill"]["spill"] == {"bytes": 2 * LIMIT, "refused": None}


def test_local_does_not_stop_a_process_that_leaves_its_group(local: Outcome) -> None:
    assert local.lingering_before_kill, "the escape attempt did not start"
    assert local.left_after_kill != []  # it outlived the group (and was killed by the test)


def test_local_reaches_the_proxy(local: Outcome) -> None:
    assert local.reports["route"] == {"attempt": "route", "body": "plain answer"}
