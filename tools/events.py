"""``gyre events tail``: print the event log, optionally following it."""

from __future__ import annotations

import argparse
from typing import Any

import msgspec

from gyre_store import RecordedEvent, iterate, subscribe
from gyre_tools.cli import add_env_argument
from gyre_tools.common import add_store_arguments, console, open_store


def register(subparsers: Any) -> None:
    events = subparsers.add_parser("events", help="read the event log")
    sub = events.add_subparsers(dest="events_command", metavar="ACTION", required=True)
    tail = sub.add_parser("tail", help="print events in commit order")
    add_store_arguments(tail)
    add_env_argument(
        tail, "--after", "GYRE_TAIL_AFTER", type=int, help="start after this position (default: last N)"
    )
    add_env_argument(
        tail, "-n", "GYRE_TAIL_LINES", default="20", type=int, help="how many of the last events"
    )
    tail.add_argument("--type", action="append", dest="types", help="only events of this type (repeatable)")
    tail.add_argument("--follow", "-f", action="store_true", help="keep printing new events")
    tail.add_argument("--json", action="store_true", help="one JSON object per line")
    tail.set_defaults(func=run_tail)


def _line(ev: RecordedEvent, as_json: bool) -> str:
    body = msgspec.json.encode(ev.event).decode()
    payload = f" payload={ev.payload!r}" if ev.payload is not None else ""
    if as_json:
        return msgspec.json.encode(
            {
                "position": ev.position,
                "stream": str(ev.stream),
                "version": ev.stream_version,
                "type": ev.event_type,
                "body": ev.event,
                "payload_arrays": {k: len(v) for k, v in (ev.payload or {}).items()},
                "recorded_at": ev.recorded_at,
            }
        ).decode()
    return f"{ev.position:>8} {ev.recorded_at:%H:%M:%S} {ev.event_type:<22} {ev.stream}@{ev.stream_version} {body}{payload}"


def run_tail(args: argparse.Namespace) -> int:
    with open_store(args) as opened:
        log = opened.log
        after = args.after if args.after is not None else max(0, log.head() - args.n)
        last = after
        for ev in iterate(log, after, types=args.types):
            console.print(_line(ev, args.json), markup=False, soft_wrap=True)
            last = ev.position
        if args.follow:
            for batch in subscribe(log, max(last, log.head() if args.types else last), types=args.types):
                for ev in batch:
                    console.print(_line(ev, args.json), markup=False, soft_wrap=True)
    return 0
