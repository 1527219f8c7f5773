"""The unprivileged user of a prepared container, without an engine: ``--user`` and
``--cap-drop all`` (podman) and ``user`` and ``cap_drop`` (the Docker API) for a harness with a
user, neither for a one-off run; who that user is (``users.sandbox_user``, ``users.lease_user``:
a uid of the pool no other process holds, given back, never a host user's); and the hand-over of
writable binds to it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gyre_train.exceptions import SandboxError
from gyre_train.sandbox import Bind
from gyre_train.sandbox.docker import create_kwargs
from gyre_train.sandbox.images import Harness
from gyre_train.sandbox.podman import run_args
from gyre_train.sandbox.users import NOBODY, hand_binds_over, lease_user, sandbox_user

USER = (4321, 4322)


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A folder others may pass through (pytest's own are its owner's only)."""
    path = Path(tempfile.mkdtemp(prefix="gyre-users-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _after(args: list[str], flag: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args) if a == flag]


def test_a_prepared_podman_container_runs_as_its_user_with_no_capabilities() -> None:
    args = run_args("img", ["true"], name="n", workdir="/w", harness=Harness("x", user=USER))
    assert _after(args, "--user") == ["4321:4322"] and _after(args, "--cap-drop") == ["all"]
    assert args.index("--user") < args.index("img")  # an option of podman run, not of the command
    for plain in (run_args("img", ["true"], name="n", workdir="/w"), run_args("img", ["true"], name="n", workdir="/w", harness=Harness("x"))):  # fmt: skip
        assert "--user" not in plain and "--cap-drop" not in plain  # the image's user


def test_a_prepared_docker_container_runs_as_its_user_with_no_capabilities() -> None:
    kwargs = create_kwargs("img", ["true"], name="n", workdir="/w", harness=Harness("x", user=USER))
    assert (kwargs["user"], kwargs["cap_drop"]) == ("4321:4322", ["ALL"])
    for plain in (create_kwargs("img", ["true"], name="n", workdir="/w"), create_kwargs("img", ["true"], name="n", workdir="/w", harness=Harness("x"))):  # fmt: skip
        assert "user" not in plain and "cap_drop" not in plain


def test_the_sandbox_user_is_nobody_for_root_and_the_caller_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert sandbox_user() == (NOBODY, NOBODY) and sandbox_user(1234) == (1234, 1234)
    with pytest.raises(SandboxError, match="may not be root"):
        sandbox_user(0)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(os, "getegid", lambda: 1001)
    assert sandbox_user() == (1000, 1001)  # its files are its own: nothing to hand over


@pytest.mark.skipif(os.geteuid() != 0, reason="handing files to another user needs root")
def test_writable_binds_are_handed_over_and_every_bind_must_be_readable(open_tmp: Path) -> None:
    tmp_path = open_tmp
    ws, ro, closed = tmp_path / "ws", tmp_path / "ro", tmp_path / "closed"
    for folder in (ws / "sub", ro, closed):
        folder.mkdir(parents=True)
    (ws / "sub" / "f").write_text("x")
    hand_binds_over([Bind(ws, "/app", writable=True), Bind(ro, "/ro")], USER)
    owners = {(p.stat().st_uid, p.stat().st_gid) for p in [ws, *ws.rglob("*")]}
    assert owners == {USER} and ro.stat().st_uid == 0  # a read-only bind stays the host's
    closed.chmod(0o700)
    with pytest.raises(SandboxError, match=r"route: .*closed is not readable by the sandbox's user 4321"):
        hand_binds_over([Bind(ws, "/app", writable=True)], USER, route=[Bind(closed, "/run/gyre")])


FREE = 3_500_000_000  # uids no host user has, for pools of the tests' own


def test_a_command_not_started_by_root_runs_as_the_caller_unleased(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(os, "getegid", lambda: 1001)
    lease = lease_user(folder=Path("/nonexistent/never-made"))
    assert lease.user == (1000, 1001) and not lease.leased


def test_leased_uids_are_distinct_until_given_back(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    pool = {"first": FREE, "size": 2, "folder": tmp_path / "leases"}
    first, second = lease_user(**pool), lease_user(**pool)  # type: ignore[arg-type]
    assert {first.uid, second.uid} == {FREE, FREE + 1} and first.gid == first.uid and first.leased
    assert sorted(p.name for p in (tmp_path / "leases").iterdir()) == [str(FREE), str(FREE + 1)]
    with pytest.raises(
        SandboxError, match=r"every uid of the sandbox pool \(3500000000 to 3500000001\) is held"
    ):
        lease_user(**pool)  # type: ignore[arg-type]
    given = first.uid
    first.release()
    first.release()  # a second release does nothing
    assert not first.leased and not (tmp_path / "leases" / str(given)).exists()
    with lease_user(**pool) as again:  # type: ignore[arg-type]
        assert again.uid == given
    assert lease_user(1234, **pool).user == (1234, 1234)  # type: ignore[arg-type]  # a given uid: no lease


def test_a_host_users_uid_is_never_leased(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    with pytest.raises(SandboxError, match="every uid"):
        lease_user(first=NOBODY, size=1, folder=tmp_path)  # /etc/passwd's nobody
    with pytest.raises(SandboxError, match="every uid"):
        lease_user(first=0, size=1, folder=tmp_path)  # root


HOLDER = """
import os, sys, time
from pathlib import Path
os.geteuid = lambda: 0
from gyre_train.sandbox.users import lease_user
lease = lease_user(first=int(sys.argv[1]), size=1, folder=Path(sys.argv[2]))
print(lease.uid, flush=True)
time.sleep(60)
"""


def test_a_uid_another_process_holds_is_skipped_until_that_process_dies(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    folder = tmp_path / "leases"
    with subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(FREE), str(folder)], stdout=subprocess.PIPE, text=True
    ) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == str(FREE)
            monkeypatch.setattr(os, "geteuid", lambda: 0)
            with pytest.raises(SandboxError, match="every uid"):
                lease_user(first=FREE, size=1, folder=folder)
            holder.send_signal(signal.SIGKILL)  # no release: the kernel drops its lock with it
            holder.wait(timeout=30)
            with lease_user(first=FREE, size=1, folder=folder) as lease:
                assert lease.uid == FREE
        finally:
            holder.kill()


def test_a_one_off_podman_container_maps_its_ids_unless_a_host_user_has_one_of_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gyre_train.sandbox import users

    args = run_args("img", ["true"], name="n", workdir="/w", mapped_root=users.container_root())
    assert _after(args, "--uidmap") == _after(args, "--gidmap") == ["0:3000000:65536"]
    assert args.index("--uidmap") < args.index("img")
    assert "--uidmap" not in run_args("img", ["true"], name="n", workdir="/w")
    monkeypatch.setattr(users, "_host_uids", lambda: ({0}, [range(2_999_000, 3_000_001)]))
    with pytest.raises(SandboxError, match=r"overlap a host user's \(from 2999000\)"):
        users.container_root()
    monkeypatch.setattr(users, "_host_uids", lambda: ({3_065_535}, []))
    with pytest.raises(SandboxError, match="from 3065535"):
        users.container_root()
    monkeypatch.setattr(users, "_host_uids", lambda: ({3_065_536}, [range(2_000_000, 3_000_000)]))
    assert users.container_root() == 3_000_000  # just outside, on both sides
