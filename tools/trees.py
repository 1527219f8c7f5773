"""``gyre trees stats|show``: trajectory trees of stored executions."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import msgspec
from rich.table import Table

from gyre_store import PostgresProjectionStore, catch_up
from gyre_store.trees import TreeStats, TreeView, draw, outline
from gyre_tools.common import add_store_arguments, all_projections, console, open_store

PAPER = {  # execution f3ad38e5, the paper's Appendix C
    "requests": 636,
    "unique_message_nodes": 1347,
    "candidates": 10,
    "nodes_per_path_min": 53,
    "nodes_per_path_max": 293,
    "node_occurrences_expanded": 1716,
    "repetitions_saved": 369,
}


def register(subparsers: Any) -> None:
    trees = subparsers.add_parser("trees", help="inspect trajectory trees")
    sub = trees.add_subparsers(dest="trees_command", metavar="ACTION", required=True)
    st = sub.add_parser("stats", help="requests, message nodes, candidates and repetition saved")
    add_store_arguments(st)
    which = st.add_mutually_exclusive_group(required=True)
    which.add_argument("--execution", help="one execution id")
    which.add_argument("--all", action="store_true", help="every execution with a tree")
    st.add_argument("--json", action="store_true", help="machine-readable output")
    st.set_defaults(func=run_stats)
    show = sub.add_parser("show", help="draw an execution's tree (terminal outline and an image)")
    add_store_arguments(show)
    show.add_argument("--execution", required=True)
    show.add_argument("--out", default=None, help="image path, .png or .svg (default out/trees/ID.png)")
    show.set_defaults(func=run_show)


def stats_table(stats: list[TreeStats]) -> Table:
    table = Table(title="trajectory trees (message nodes; the paper's f3ad38e5 for comparison)")
    table.add_column("figure")
    for s in stats:
        table.add_column(s.execution_id[-14:], justify="right")
    table.add_column("paper f3ad38e5", justify="right")
    rows = [
        ("requests", "requests"),
        ("context roots", "roots"),
        ("unique message nodes", "unique_message_nodes"),
        ("unique tokens", "unique_tokens"),
        ("candidate trajectories", "candidates"),
        ("nodes per path, min", "nodes_per_path_min"),
        ("nodes per path, max", "nodes_per_path_max"),
        ("node occurrences if expanded", "node_occurrences_expanded"),
        ("repetitions saved", "repetitions_saved"),
        ("tokens if every path expanded", "tokens_expanded"),
        ("record inputs, total tokens", "record_input_tokens"),
    ]
    for label, key in rows:
        table.add_row(label, *(f"{getattr(s, key):,}" for s in stats), str(PAPER.get(key, "")))
    table.add_row(
        "candidates by class",
        *(", ".join(f"{k} {v}" for k, v in s.candidates_by_class.items()) for s in stats),
        "",
    )
    return table


def _store(opened: Any) -> PostgresProjectionStore:
    projections = all_projections()
    store = PostgresProjectionStore(opened.log.pool, projections.tables())
    catch_up(opened.log, store, projections.get("trees"))
    return store


def run_stats(args: argparse.Namespace) -> int:
    with open_store(args) as opened:
        store = _store(opened)
        if args.all:
            ids = sorted({r["execution_id"] for r in store.dump("gyre_tree_state")})
        else:
            ids = [args.execution]
        stats = [TreeView.load(store, ex).stats() for ex in ids]
    if args.json:
        print(msgspec.json.encode(stats).decode())
    else:
        console.print(stats_table(stats))
    return 0


def run_show(args: argparse.Namespace) -> int:
    with open_store(args) as opened:
        view = TreeView.load(_store(opened), args.execution)
    console.print(outline(view))
    out = Path(args.out or f"out/trees/{args.execution}.png")
    draw(view, out)
    console.print(f"drawing written to {out}")
    return 0
