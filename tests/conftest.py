"""Shared fixtures: every test starts with no GYRE_* variable set. Every Hypothesis test runs
under the ``gyre`` settings profile registered here."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

# Both wall-clock checks of Hypothesis (a 200 ms deadline per example, and too_slow when drawing
# the examples takes long) fail a property on a loaded machine, not a wrong one: CI runs on two
# shared cores, and timings belong in benchmarks/. Loaded before any test module is imported, so
# every @settings(...) in the suite inherits these and sets only its own max_examples.
settings.register_profile("gyre", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("gyre")


@pytest.fixture(autouse=True)
def _clear_gyre_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # Configuration reaches the packages only through entry points; a stray
    # GYRE_DATABASE_URL in a developer's shell must not change what a test sees.
    for name in list(os.environ):
        # GYRE_TEST_* point the suite at its servers; they are not gyre configuration.
        if name.startswith("GYRE_") and not name.startswith("GYRE_TEST_"):
            monkeypatch.delenv(name, raising=False)
    yield
