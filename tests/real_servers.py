"""What a test does when a real server, harness or package it needs (SGLang, Mooncake, Claude
Code, Codex, Megatron-core, PostgreSQL's server binaries) is not there: it fails.

`tools/run-tests.sh` installs and starts these; when that fails it passes the reason in
``GYRE_TEST_<NAME>_ERROR``, and the tests fail with it rather than skip, so a broken set-up
cannot pass CI unnoticed. ``GYRE_TEST_SKIP_<NAME>=1`` is the explicit opt-out (for the two
harnesses ``GYRE_TEST_SKIP_HARNESSES=1`` as well): then they skip and say so. All are
``GYRE_TEST_*`` variables, which the root conftest keeps.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import NoReturn

import pytest


def unavailable(name: str, reason: str, group: str | None = None) -> NoReturn:
    """Fail (or skip, under ``GYRE_TEST_SKIP_<NAME>=1`` or ``GYRE_TEST_SKIP_<GROUP>=1``) because
    NAME is not usable: REASON."""
    key = name.upper()
    setup_error = os.environ.get(f"GYRE_TEST_{key}_ERROR")
    if setup_error:
        reason = f"tools/run-tests.sh could not set it up: {setup_error}"
    else:
        reason = f"{reason}; `bash tools/run-tests.sh` sets it up"
    opt_outs = [f"GYRE_TEST_SKIP_{key}"] + ([f"GYRE_TEST_SKIP_{group.upper()}"] if group else [])
    for opt_out in opt_outs:
        if os.environ.get(opt_out) == "1":
            pytest.skip(f"{key} SKIPPED ON REQUEST ({opt_out}=1): {reason}")
    pytest.fail(
        f"{key} UNAVAILABLE ({' or '.join(f'{o}=1' for o in opt_outs)} skips these tests instead): {reason}",
        pytrace=False,
    )


def harness_binary(name: str, installer: Path) -> str:
    """The path of harness NAME's executable, which INSTALLER (one of ``tools/install_*.sh``)
    installs and prints last; when it cannot, the test fails with its stderr (``unavailable``,
    group ``harnesses``)."""
    done = subprocess.run(["bash", str(installer)], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        unavailable(
            name,
            f"{installer.name} exited {done.returncode} (npm unreachable?): {done.stderr.strip()[-300:]}",
            group="harnesses",
        )
    return done.stdout.strip().splitlines()[-1]


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


def megatron_missing() -> str | None:
    """Why Megatron-core cannot be used here, or None when it can (it is in the ``dev`` extra)."""
    import importlib.util

    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        return "MEGATRON-CORE NOT INSTALLED: pip install megatron-core==0.16.1 (the dev extra has it)"
    return None


def require(name: str, missing: str | None) -> None:
    """Go on when ``missing`` is None; else fail with it (``unavailable``: the explicit opt-out
    ``GYRE_TEST_SKIP_<NAME>=1`` skips instead)."""
    if missing is not None:
        unavailable(name, missing)
