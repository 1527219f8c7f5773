"""The gyre command: every option has a GYRE_* environment fallback shown in --help."""

from __future__ import annotations

import argparse

import pytest

from gyre_tools.cli import build_parser


def _walk(parser: argparse.ArgumentParser, path: str) -> list[tuple[str, argparse.Action]]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _walk(sub, f"{path} {name}")
        elif action.option_strings and action.dest != "help":
            out.append((path, action))
    return out


def test_every_option_names_its_environment_variable() -> None:
    actions = _walk(build_parser(), "gyre")
    assert len(actions) > 50
    missing = [f"{path} {a.option_strings[0]}" for path, a in actions if "(env GYRE_" not in (a.help or "")]
    assert missing == []


def test_environment_fallbacks_reach_the_parsed_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GYRE_EVENTS_TAIL_FOLLOW", "yes")
    monkeypatch.setenv("GYRE_EVENTS_TAIL_TYPE", "execution.started,execution.finished")
    monkeypatch.setenv("GYRE_DATABASE_URL", "postgresql://db.example/gyre")
    args = build_parser().parse_args(["events", "tail"])
    assert args.follow is True
    assert args.types == ["execution.started", "execution.finished"]
    assert args.database_url == "postgresql://db.example/gyre"
    # the command line still wins
    assert (
        build_parser().parse_args(["events", "tail", "--database-url", "postgresql://x/y"]).database_url
        == "postgresql://x/y"
    )
