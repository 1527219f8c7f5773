"""``DiskCap`` (``Limits.disk_mb``) on its own: the image mounted over each writable bind's host
path, what it refuses, and a writable file bind under ``bwrap`` (the ``[sandbox] disk_mb`` key:
``tests/unit/test_disk_mb_config.py``).
The hostile agent's attempt to fill a capped workspace is ``test_sandbox_blocks``. Loop mounts
need root: the tests that mount are skipped without it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gyre_train.sandbox import Bind, DiskCap, Limits, SandboxError, bwrap_missing, sandbox_for
from tests.real_servers import require

MIB = 2**20
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="loop mounts need root")


def _folder(path: Path) -> Path:
    path.mkdir()
    path.chmod(0o755)
    return path


def test_a_cap_under_one_mb_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SandboxError, match="disk_mb must be at least 1, got 0"):
        DiskCap([Bind(tmp_path, "/app", writable=True)], 0)


def test_nested_writable_binds_are_refused(tmp_path: Path) -> None:
    inner = _folder(tmp_path / "inner")
    with pytest.raises(SandboxError, match="writable binds may not nest"):
        DiskCap([Bind(tmp_path, "/app", writable=True), Bind(inner, "/app2", writable=True)], 8)


def test_without_a_cap_nothing_is_mounted(tmp_path: Path) -> None:
    with DiskCap([Bind(tmp_path, "/app", writable=True)], None) as cap:
        assert cap.image is None and not tmp_path.is_mount()


@needs_root
def test_the_host_path_is_capped_while_mounted_and_keeps_its_files_after(tmp_path: Path) -> None:
    workspace = _folder(tmp_path / "ws")
    (workspace / "before.txt").write_text("before\n")
    (workspace / "deleted.txt").write_text("x\n")
    readonly = _folder(tmp_path / "ro")
    with DiskCap([Bind(workspace, "/app", writable=True), Bind(readonly, "/ro")], 8) as cap:
        assert cap.image is not None and cap.image.is_file()
        assert workspace.is_mount() and not readonly.is_mount()  # only writable binds are capped
        assert (workspace / "before.txt").read_text() == "before\n"  # copied onto the image
        (workspace / "deleted.txt").unlink()
        written = 0
        with pytest.raises(OSError, match="No space left"), (workspace / "fill").open("wb") as out:
            for _ in range(16):
                out.write(b"x" * MIB)
                out.flush()
                written += MIB
        assert written < 8 * MIB
        image = cap.image
    assert not workspace.is_mount() and not image.exists()
    assert sorted(p.name for p in workspace.iterdir()) == ["before.txt", "fill"]
    assert (workspace / "fill").stat().st_size >= written


@needs_root
def test_mount_then_releases_the_cap_when_the_preparation_fails(tmp_path: Path) -> None:
    workspace = _folder(tmp_path / "ws")
    (workspace / "kept.txt").write_text("kept\n")
    cap = DiskCap([Bind(workspace, "/app", writable=True)], 8)
    seen: list[bool] = []

    def prepare() -> None:
        seen.append(workspace.is_mount())  # the preparation sees the capped bind
        (workspace / "written.txt").write_text("during\n")
        raise SandboxError("the hand-over failed")

    with pytest.raises(SandboxError, match="the hand-over failed"):
        cap.mount_then(prepare)
    assert seen == [True]
    assert cap.image is None and not workspace.is_mount()
    assert sorted(p.name for p in workspace.iterdir()) == ["kept.txt", "written.txt"]
    assert cap.mount_then(lambda: 7) == 7 and workspace.is_mount()
    cap.release()
    assert not workspace.is_mount()


@needs_root
def test_binds_already_over_the_cap_are_refused_and_nothing_stays_mounted(tmp_path: Path) -> None:
    workspace = _folder(tmp_path / "ws")
    (workspace / "big").write_bytes(b"x" * (3 * MIB))
    cap = DiskCap([Bind(workspace, "/app", writable=True)], 2)
    with pytest.raises(SandboxError, match="already hold more than 2 MB"):
        cap.mount()
    assert cap.image is None and not workspace.is_mount()
    assert (workspace / "big").stat().st_size == 3 * MIB


@pytest.fixture
def open_path() -> Iterator[Path]:
    """A folder the sandbox's user (nobody) can reach (pytest's own is root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="gyre-disk-test-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@needs_root
def test_a_writable_file_bind_under_bwrap_is_capped_and_copied_back(open_path: Path) -> None:
    require("bwrap", bwrap_missing())
    tmp_path = open_path
    workspace = _folder(tmp_path / "ws")
    notes = tmp_path / "notes.txt"
    notes.write_text("first\n")
    notes.chmod(0o666)
    result = sandbox_for("bwrap").run(
        [
            "/bin/sh",
            "-c",
            "echo second >> /notes.txt && df -k /app | tail -n 1 && head -c 9000000 /dev/zero > big",
        ],
        workdir="/app",
        binds=[Bind(workspace, "/app", writable=True), Bind(notes, "/notes.txt", writable=True)],
        timeout_s=60,
        limits=Limits(disk_mb=4),
    )
    assert result.exit_code != 0 and "No space left" in result.stderr, result
    assert int(result.stdout.split()[1]) <= 4 * 1024, result.stdout  # the workspace's file system: 4 MB
    assert notes.read_text() == "first\nsecond\n"  # the file bind's write came back
    assert 0 < (workspace / "big").stat().st_size < 4 * MIB
    assert not workspace.is_mount() and not notes.is_mount()
