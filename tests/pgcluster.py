"""A private PostgreSQL cluster that a test may stop and restart.

Uses the machine's PostgreSQL binaries in a temporary folder on a free port, so a restart
never disturbs the shared server other tests use. As root, the server runs as the
``postgres`` system user, as PostgreSQL requires.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path


def _bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if candidates:
        return candidates[-1]
    try:  # the binaries the embedded-server package ships
        import pgserver

        shipped = Path(pgserver.__file__).parent / "pginstall" / "bin" / name
        return str(shipped) if shipped.exists() else None
    except ImportError:
        return None


def available() -> bool:
    return _bin("initdb") is not None and _bin("pg_ctl") is not None


def missing() -> str | None:
    """Why a private cluster cannot be made here, or None when it can."""
    if available():
        return None
    return "POSTGRESQL SERVER BINARIES (initdb, pg_ctl) NOT FOUND: apt-get install postgresql, or pip install pgserver"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateCluster:
    """``listen``: the addresses it listens on besides loopback; ``trust``: the network (CIDR)
    whose clients it lets in without a password, besides loopback's."""

    def __init__(self, *, listen: tuple[str, ...] = (), trust: str | None = None) -> None:
        self.listen, self.trust = listen, trust
        self.dir = Path(tempfile.mkdtemp(prefix="gyre-pg-"))
        self.data = self.dir / "data"
        self.port = _free_port()
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            shutil.chown(self.dir, "postgres", "postgres")

    def _run(self, *args: str) -> None:
        cmd = list(args)
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True, timeout=60)

    @property
    def url(self) -> str:
        return self.url_at("127.0.0.1")

    def url_at(self, address: str) -> str:
        return f"postgresql://postgres@{address}:{self.port}/postgres"

    def init(self) -> PrivateCluster:
        self._run(str(_bin("initdb")), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        if self.trust:
            with (self.data / "pg_hba.conf").open("a") as hba:
                hba.write(f"host all all {self.trust} trust\n")
        self.start()
        return self

    def start(self) -> None:
        addresses = ",".join(("127.0.0.1", *self.listen))
        opts = f"-p {self.port} -c listen_addresses={addresses} -k {self.dir} -c fsync=off"
        self._run(
            str(_bin("pg_ctl")), "-D", str(self.data), "-o", opts, "-l", str(self.dir / "log"), "-w", "start"
        )

    def stop(self, mode: str = "fast") -> None:
        self._run(str(_bin("pg_ctl")), "-D", str(self.data), "-m", mode, "-w", "stop")

    def destroy(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)
