"""What a test does when a real server it needs (SGLang, Mooncake) is not there: it fails.

`tools/run-tests.sh` installs and starts these servers; when that fails it passes the reason
in ``GYRE_TEST_<NAME>_ERROR``, and the tests fail with it rather than skip, so a broken set-up
cannot pass CI unnoticed. ``GYRE_TEST_SKIP_<NAME>=1`` is the explicit opt-out: then they skip
and say so. Both are ``GYRE_TEST_*`` variables, which the root conftest keeps.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def unavailable(name: str, reason: str) -> NoReturn:
    """Fail (or skip, under ``GYRE_TEST_SKIP_<NAME>=1``) because NAME is not usable: REASON."""
    key = name.upper()
    setup_error = os.environ.get(f"GYRE_TEST_{key}_ERROR")
    if setup_error:
        reason = f"tools/run-tests.sh could not set it up: {setup_error}"
    else:
        reason = f"{reason}; `bash tools/run-tests.sh` sets it up"
    if os.environ.get(f"GYRE_TEST_SKIP_{key}") == "1":
        pytest.skip(f"{key} SKIPPED ON REQUEST (GYRE_TEST_SKIP_{key}=1): {reason}")
    pytest.fail(
        f"{key} UNAVAILABLE (GYRE_TEST_SKIP_{key}=1 skips these tests instead): {reason}", pytrace=False
    )


def mooncake_missing() -> str | None:
    """Why Mooncake Transfer Engine cannot be imported here, or None when it can (the tests
    that need it call ``unavailable("mooncake", ...)`` with the reason)."""
    import importlib
    import importlib.util

    if importlib.util.find_spec("mooncake") is None:
        return "MOONCAKE NOT INSTALLED: pip install '.[mooncake]' (and apt-get install libibverbs1)"
    try:
        importlib.import_module("mooncake.engine")
    except (ImportError, OSError) as exc:  # the wheel needs libibverbs1 from the OS
        return f"MOONCAKE DOES NOT IMPORT ({exc}): apt-get install libibverbs1 to test it"
    return None
