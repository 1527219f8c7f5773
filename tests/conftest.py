"""Shared fixtures: every test starts with no GYRE_* variable set."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _clear_gyre_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # Configuration reaches the packages only through entry points; a stray
    # GYRE_DATABASE_URL in a developer's shell must not change what a test sees.
    for name in list(os.environ):
        # GYRE_TEST_* point the suite at its servers; they are not gyre configuration.
        if name.startswith("GYRE_") and not name.startswith("GYRE_TEST_"):
            monkeypatch.delenv(name, raising=False)
    yield
