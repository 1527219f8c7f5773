"""``gyre engine serve`` argument parsing and environment fallbacks."""

from __future__ import annotations

import argparse

import pytest

from gyre_tools import engine as engine_cli


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gyre")
    engine_cli.register(parser.add_subparsers())
    return parser.parse_args(argv)


def test_defaults() -> None:
    args = parse(["engine", "serve"])
    # The model's own context limit and the tokenizer the proxy uses (decided at run time).
    assert (args.host, args.port, args.max_context, args.seed) == ("127.0.0.1", 30000, 0, 0)
    assert args.tokenizer == "auto"
    assert args.func is engine_cli.run_serve


def test_environment_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GYRE_ENGINE_PORT", "31001")
    monkeypatch.setenv("GYRE_ENGINE_SCRIPT", "/tmp/s.json")
    args = parse(["engine", "serve", "--seed", "4"])
    assert (args.port, args.script, args.seed) == (31001, "/tmp/s.json", 4)


def test_help_names_the_variables(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse(["engine", "serve", "--help"])
    out = capsys.readouterr().out
    for variable in (
        "GYRE_ENGINE_PORT",
        "GYRE_ENGINE_MODEL_DIR",
        "GYRE_ENGINE_MAX_CONTEXT",
        "GYRE_ENGINE_SCRIPT",
    ):
        assert variable in out


def test_bad_model_config_is_an_error_status() -> None:
    assert engine_cli.run_serve(parse(["engine", "serve", "--model-config", "{not json"])) == 2
    assert engine_cli.run_serve(parse(["engine", "serve", "--model-config", '{"vocab_size": 10}'])) == 1
    assert engine_cli.run_serve(parse(["engine", "serve", "--max-context", "-1"])) == 2
