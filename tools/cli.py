"""The ``gyre`` command: one argparse parser, one module per subcommand group.

Each module in ``SUBCOMMAND_MODULES`` exposes ``register(subparsers)``, which adds its
parser(s) and sets ``func`` on them; ``func(args) -> int`` is the exit status.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import importlib
import io
import os
import signal
import sys
import warnings
from collections.abc import Sequence

SUBCOMMAND_MODULES: tuple[str, ...] = (
    "gyre_tools.ablate",
    "gyre_tools.checkpoint",
    "gyre_tools.db",
    "gyre_tools.events",
    "gyre_tools.export",
    "gyre_tools.projections",
    "gyre_tools.replay",
    "gyre_tools.run",
    "gyre_tools.serve",
    "gyre_tools.engine",
    "gyre_tools.sched",
    "gyre_tools.simulate",
    "gyre_tools.tasks",
    "gyre_tools.tracegen",
    "gyre_tools.proxy",
    "gyre_tools.trees",
    "gyre_tools.ui",
)


def env_default(var: str, default: str | None = None) -> str | None:
    """The value of environment variable ``var``, or ``default``."""
    return os.environ.get(var, default)


def add_env_argument(
    parser: argparse.ArgumentParser,
    flag: str,
    var: str,
    *,
    default: str | None = None,
    help: str,
    type: type = str,
    **kwargs: object,
) -> None:
    """Add ``flag`` whose default comes from ``$var`` (then ``default``); --help shows both."""
    raw = env_default(var, default)
    value = type(raw) if raw is not None else None
    shown = f" (env {var}" + (f", default {default}" if default is not None else "") + ")"
    parser.add_argument(flag, default=value, type=type, help=help + shown, **kwargs)  # type: ignore[arg-type]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gyre",
        description="gyre: online RL for xLong-horizon agents on an event-sourced data plane.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue  # a subcommand group not built yet
            raise
        module.register(subparsers)
    _env_fallbacks(parser, "GYRE")
    return parser


def _env_fallbacks(parser: argparse.ArgumentParser, prefix: str) -> None:
    """Give every option that has no environment fallback yet one named after its command.

    ``gyre events tail --follow`` reads ``GYRE_EVENTS_TAIL_FOLLOW``; flags take 1/true/yes,
    repeatable options a comma-separated list. The variable is shown in ``--help``.
    """
    for action in parser._actions:  # argparse keeps no public list of its actions
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                _env_fallbacks(sub, f"{prefix}_{name.upper().replace('-', '_')}")
            continue
        if not action.option_strings or action.dest == "help" or "(env " in (action.help or ""):
            continue
        flag = max(action.option_strings, key=len)
        var = f"{prefix}_{flag.lstrip('-').upper().replace('-', '_')}"
        raw = os.environ.get(var)
        if raw is not None:
            if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
                on = raw.strip().lower() in ("1", "true", "yes", "on")
                action.default = on if isinstance(action, argparse._StoreTrueAction) else not on
            elif isinstance(action, argparse._AppendAction):
                action.default = [s for s in raw.split(",") if s]
            else:
                action.default = action.type(raw) if callable(action.type) else raw
        action.help = f"{action.help or ''} (env {var})"


def main(argv: Sequence[str] | None = None) -> int:
    # The embedded servers' packages ask platformdirs for a runtime dir that a headless
    # machine does not have; the fallback is fine and the warning only confuses users.
    warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
    # `kill -USR1 <pid>` prints where every thread of a gyre process is to its log (stderr):
    # how to see why a process does not stop or does not move on.
    with contextlib.suppress(io.UnsupportedOperation, ValueError):  # a stderr without a file (tests)
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    except _domain_errors() as exc:
        # Errors a user can act on get one line, not a traceback.
        print(f"gyre: error: {exc}", file=sys.stderr)
        return 2
    return status


def _domain_errors() -> tuple[type[Exception], ...]:
    roots: list[type[Exception]] = []
    for module, name in (
        ("gyre_store.exceptions", "GyreStoreError"),
        ("gyre_proxy.exceptions", "GyreProxyError"),
        ("gyre_sched.exceptions", "GyreSchedError"),
        ("gyre_train.exceptions", "GyreTrainError"),
        ("gyre_tools.run_config", "ConfigFileError"),  # a run's config: the bad key, not a traceback
    ):
        try:
            roots.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            continue
    return tuple(roots)


if __name__ == "__main__":
    sys.exit(main())
