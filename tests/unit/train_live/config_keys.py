"""Checks shared by the run-config tests of the training keys."""

from __future__ import annotations

import pytest

from gyre_tools.run_config import ConfigFileError, RunConfig, parse_config, to_toml


def assert_documented_and_round_trips(config: RunConfig, keys: tuple[str, ...]) -> None:
    """`--write-config`'s text of ``config`` documents each of ``keys`` on its line and reads back equal."""
    text = to_toml(config)
    for key in keys:
        line = next(line for line in text.splitlines() if line.startswith(f"{key} = "))
        assert "#" in line, key  # every key carries its documentation
    assert parse_config(text) == config


def assert_refused_in_one_line(text: str, why: str) -> None:
    """``text`` is refused with a one-line error matching ``why``."""
    with pytest.raises(ConfigFileError, match=why) as refused:
        parse_config(text, where="run.toml")
    assert "\n" not in str(refused.value)
