"""The address other machines reach a server at, and when a listening address gives them none:
one rule for the rollout engines, ``gyre engine serve``, ``gyre proxy serve`` and ``gyre node serve``."""

from __future__ import annotations

import pytest

from gyre_proxy.engines import WILDCARD_HOSTS, needs_advertise_host, reachable_host


@pytest.mark.parametrize(
    ("host", "advertise_host", "reached_at"),
    [
        ("10.0.0.2", "node-b.cluster", "node-b.cluster"),  # the advertised host first
        ("0.0.0.0", "10.0.0.5", "10.0.0.5"),
        ("::", "fd00::2", "fd00::2"),
        ("10.0.0.2", None, "10.0.0.2"),  # else the listening host
        ("10.0.0.2", "", "10.0.0.2"),  # an empty advertise host is none
        ("0.0.0.0", None, "127.0.0.1"),  # else, listening on every address, this machine only
        ("::", "", "127.0.0.1"),
        ("", None, "127.0.0.1"),
    ],
)
def test_a_server_is_reached_at_its_advertised_host_else_its_own_else_loopback(
    host: str, advertise_host: str | None, reached_at: str
) -> None:
    assert reachable_host(host, advertise_host) == reached_at


@pytest.mark.parametrize("wildcard", WILDCARD_HOSTS)
def test_listening_on_every_address_needs_an_advertised_one_that_is_not_every_address(wildcard: str) -> None:
    assert needs_advertise_host(wildcard, None) and needs_advertise_host(wildcard, "")
    assert not needs_advertise_host(wildcard, "10.0.0.5")
    assert not needs_advertise_host("10.0.0.2", None)
    assert needs_advertise_host("10.0.0.2", wildcard or "0.0.0.0")  # advertising every address
