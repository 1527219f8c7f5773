"""Hosts for tests, made of Linux network namespaces: each host is a namespace with its own
loopback and one veth link to a bridge in the test's namespace, which holds the first address
of the subnet. A process started in a host (``host.command(...)``) reaches the others, and the
test's namespace, only through their addresses on the bridge; its own 127.0.0.1 is its own.

Needs root and ``ip`` (iproute2); without them the tests that use it fail with the reason
(``GYRE_TEST_SKIP_NETNS=1`` skips them instead).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from tests.real_servers import unavailable


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


@dataclass
class Host:
    """One namespace host: its name, its address on the bridge and its end of the link."""

    namespace: str
    address: str
    link: str  # the bridge's end of its veth pair, in the test's namespace

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this host."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def link_down(self) -> None:
        """Cut the host off the bridge (its processes live on, unreachable)."""
        _ip("link", "set", self.link, "down")


@dataclass
class Network:
    """The bridge, its address in the test's namespace (``gateway``) and the hosts on it."""

    tag: str
    subnet: int  # 10.231.<subnet>.0/24
    hosts: list[Host] = field(default_factory=list)

    @property
    def bridge(self) -> str:
        return f"gbr{self.tag}"

    @property
    def gateway(self) -> str:
        return f"10.231.{self.subnet}.1"

    def add_host(self, name: str) -> Host:
        index = len(self.hosts) + 2
        host = Host(f"gyre-{self.tag}-{name}", f"10.231.{self.subnet}.{index}", f"gv{self.tag}{index}")
        inside = f"gi{self.tag}{index}"
        _ip("netns", "add", host.namespace)
        self.hosts.append(host)
        _ip("link", "add", host.link, "type", "veth", "peer", "name", inside)
        _ip("link", "set", host.link, "master", self.bridge)
        _ip("link", "set", host.link, "up")
        _ip("link", "set", inside, "netns", host.namespace)
        for args in (
            ("addr", "add", f"{host.address}/24", "dev", inside),
            ("link", "set", inside, "up"),
            ("link", "set", "lo", "up"),
        ):
            _ip("-n", host.namespace, *args)
        return host


@contextmanager
def network() -> Iterator[Network]:
    """A bridge with the test's namespace on it; ``add_host`` adds hosts. All removed after."""
    if os.geteuid() != 0:
        unavailable("netns", "network namespaces need root")
    net = Network(tag=f"{os.getpid() % 10000}", subnet=os.getpid() % 200 + 20)
    try:
        _ip("link", "add", net.bridge, "type", "bridge")
    except (RuntimeError, FileNotFoundError) as exc:
        unavailable("netns", f"cannot make a bridge: {exc}")
    try:
        _ip("addr", "add", f"{net.gateway}/24", "dev", net.bridge)
        _ip("link", "set", net.bridge, "up")
        yield net
    finally:
        for host in net.hosts:
            subprocess.run(["ip", "link", "del", host.link], capture_output=True, timeout=30)
            subprocess.run(["ip", "netns", "del", host.namespace], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", net.bridge], capture_output=True, timeout=30)
