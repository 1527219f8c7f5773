"""The run's ``[sandbox] disk_mb``: read, checked, and written by ``gyre run --write-config``."""

from __future__ import annotations

import pytest

from gyre_tools.run_config import DEMO, ConfigFileError, parse_config, to_toml


def test_the_sandbox_key_disk_mb_is_read_and_written() -> None:
    assert parse_config("[sandbox]\ndisk_mb = 64\n").sandbox.disk_mb == 64
    assert parse_config("[sandbox]\ndisk_mb = 0\n").sandbox.disk_mb == 0  # no cap
    assert DEMO.sandbox.disk_mb == 10240
    capped = parse_config("[sandbox]\ndisk_mb = 64\n")
    assert parse_config(to_toml(capped)).sandbox.disk_mb == 64  # --write-config writes the key
    with pytest.raises(ConfigFileError, match="disk_mb"):
        parse_config("[sandbox]\ndisk_mb = -1\n")
