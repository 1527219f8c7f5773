"""The cap on the total a sandbox may write (``Limits.disk_mb``): every writable bind moved onto
one ext4 image of that size, loop-mounted on the host and bound back over each bind's own path.

Rlimits cap one file and no cgroup caps a total, so the writable binds get a file system of their
own: a write past the cap fails with ``ENOSPC`` and the command goes on. The host sees the files
at their own paths throughout (the image is mounted over them, so the sandbox binds it without
knowing); ``release`` copies them back into the folders beneath, unmounts and deletes the image.
The image is sparse: it takes only what is written. Needs root (``mount``, loop devices). Used by
the ``bwrap``, ``podman`` and ``docker`` kinds; ``local`` has no cap.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self, TypeVar

from gyre_train.exceptions import SandboxError
from gyre_train.sandbox.base import Bind

T = TypeVar("T")

MKFS = ("mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal", "-E", "root_owner=0:0")
MOUNT_OPTIONS = "loop,nosuid,nodev"
TOOL_TIMEOUT_S = 120.0  # a copy of a large workspace, say


class DiskCap:
    """The writable ``binds`` capped at ``size_mb`` in total while mounted (see the module
    docstring); ``size_mb`` None caps nothing. A context manager; or ``mount`` then ``release``
    (a prepared sandbox's cleanup). The image lies in a fresh folder under ``scratch`` (default:
    the host's temporary folder). Raises SandboxError for a cap under 1 MB or nested binds."""

    def __init__(self, binds: Sequence[Bind], size_mb: int | None, *, scratch: Path | None = None) -> None:
        if size_mb is not None and size_mb < 1:
            raise SandboxError(f"disk_mb must be at least 1, got {size_mb}")
        self.size_mb = size_mb or 0
        self.sources = [] if size_mb is None else _writable_sources(binds)
        self._scratch_root = scratch
        self._folder: Path | None = None
        self._bound: list[tuple[Path, Path]] = []  # (host path, its copy on the image), mounted over it

    @property
    def image(self) -> Path | None:
        """The image file while mounted (None when there is nothing to cap, or once released)."""
        return None if self._folder is None else self._folder / "disk.img"

    def __enter__(self) -> Self:
        self.mount()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    def mount(self) -> None:
        """Make the image, copy each writable bind's files onto it and mount it over that bind's
        host path. Raises SandboxError (with nothing left mounted) when not root, when a tool
        fails, or when the binds already hold more than the cap."""
        if not self.sources or self._folder is not None:
            return
        if os.geteuid() != 0:
            raise SandboxError("disk_mb: the cap loop-mounts a file system image: run as root, or set no cap")
        self._folder = Path(tempfile.mkdtemp(prefix="gyre-disk-", dir=self._scratch_root))
        image, top = self._folder / "disk.img", self._folder / "mnt"
        try:
            with image.open("wb") as sparse:
                sparse.truncate(self.size_mb * 2**20)
            _tool([*MKFS, str(image)], "make the file system")
            top.mkdir()
            _tool(["mount", "-o", MOUNT_OPTIONS, str(image), str(top)], "mount the image")
            for index, source in enumerate(self.sources):
                copy = top / str(index)
                try:
                    _copy_in(source, copy)
                except SandboxError as exc:
                    if "No space left" in str(exc):
                        raise SandboxError(
                            f"disk_mb: the writable binds already hold more than {self.size_mb} MB ({source})"
                        ) from None
                    raise
                _tool(["mount", "--bind", str(copy), str(source)], f"mount the image over {source}")
                self._bound.append((source, copy))
        except BaseException:
            self.release()
            raise

    def mount_then(self, prepare: Callable[[], T]) -> T:
        """Mount, then ``prepare()`` what must see the capped binds (a hand-over, a command line)
        and return its result; when it fails, release again before the error goes on."""
        self.mount()
        try:
            return prepare()
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Unmount the image from every host path, copy its files back there (what the command
        deleted is deleted), unmount it and delete it. Idempotent. Raises SandboxError when a
        copy fails: the image then stays mounted, the error naming where its files are."""
        if self._folder is None:
            return
        failed: list[str] = []
        while self._bound:
            source, copy = self._bound.pop()
            try:
                _unmount(source)
                _copy_back(copy, source)
            except (SandboxError, OSError) as exc:
                failed.append(f"{source}: {exc} (its files are in {copy})")
        top = self._folder / "mnt"
        if failed:
            raise SandboxError(f"disk_mb: files not copied back, the image left mounted: {'; '.join(failed)}")
        if top.is_mount():
            _unmount(top)
        shutil.rmtree(self._folder, ignore_errors=True)
        self._folder = None


def _writable_sources(binds: Sequence[Bind]) -> list[Path]:
    """The distinct host paths of the writable binds; raises SandboxError when one lies inside
    another (each is copied onto the image as a whole)."""
    sources: list[Path] = []
    for bind in binds:
        if bind.writable and not bind.source.exists():
            raise SandboxError(f"binds: {bind.source} does not exist")
        if bind.writable and (path := bind.source.resolve()) not in sources:
            sources.append(path)
    for a in sources:
        for b in sources:
            if a != b and b.is_relative_to(a):
                raise SandboxError(f"disk_mb: writable binds may not nest ({b} is inside {a})")
    return sources


def _copy_in(source: Path, copy: Path) -> None:
    """``source`` (a folder or a file) as ``copy``, with owners, modes and times."""
    if source.is_dir():
        copy.mkdir()
        _tool(["cp", "-a", "--", f"{source}/.", str(copy)], f"copy {source} onto the image")
        info = source.stat()
        os.chown(copy, info.st_uid, info.st_gid)
        copy.chmod(info.st_mode & 0o7777)
    else:
        _tool(["cp", "-a", "--", str(source), str(copy)], f"copy {source} onto the image")


def _copy_back(copy: Path, source: Path) -> None:
    """Replace what ``source`` holds (its files before the command ran) by ``copy``'s."""
    if not copy.is_dir():
        _tool(["cp", "-a", "--", str(copy), str(source)], f"copy {source} back")
        return
    for entry in source.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    _tool(["cp", "-a", "--", f"{copy}/.", str(source)], f"copy {source} back")


def _unmount(path: Path) -> None:
    """Unmount ``path``; detached lazily when something still holds it open."""
    done = subprocess.run(["umount", str(path)], capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
    if done.returncode != 0:
        _tool(["umount", "--lazy", str(path)], f"unmount {path}")


def _tool(argv: Sequence[str], what: str) -> None:
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxError(f"disk_mb: cannot {what}: {exc}") from exc
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise SandboxError(f"disk_mb: cannot {what}: {tail}")
