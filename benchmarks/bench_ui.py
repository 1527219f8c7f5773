"""How long ``gyre ui`` takes to serve the execution view of a tree of the paper's Appendix C size.

Generates one Claude Code-shaped execution with tracegen (about 1,350 tree nodes with the
defaults), appends its records to a scratch PostgreSQL database as a live run does and builds
the tree projection there, then serves the view with the app ``gyre ui`` runs (uvicorn on
loopback) and times a GET of ``/executions/ID`` over HTTP: the first one (the process's first
page: imports and tokenizer load included) and the median of ``--repeats`` more, then the same
view as a replay (``?at=``: the tree folded from its records up to the position). The baseline,
measured in the same run: reading the same tree with the store's API alone (``TreeView.load``
from the projection), printed as a ratio. Target: the execution view in under 1 s (MET/MISSED).

    .venv/bin/python benchmarks/bench_ui.py [--requests 520] [--repeats 5] [--pg URL]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import threading
import time

import httpx
import uvicorn
from bench_stored_admission import times_of
from scratch import scratch_database
from stored_trees import store_and_project

from gyre_proxy.engines import qwen_tokenizer
from gyre_proxy.harness import ClaudeCodeHarness
from gyre_proxy.ingest import Ingestor, Qwen3Template, TraceConfig, TraceGenerator
from gyre_store import InMemoryEventLog, PostgresEventLog, StoreConfig
from gyre_store.trees import TrajectoryRecorder, TreeView
from gyre_tools.ui.app import create_app

TARGET_S = 1.0  # the execution view of a 1,300-node tree, served in under 1 s


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=520, help="main-agent requests of the execution")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--pg", default=os.environ.get("GYRE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
    )
    args = parser.parse_args()

    memory = InMemoryEventLog()
    ingestor = Ingestor(TrajectoryRecorder(memory), Qwen3Template(qwen_tokenizer()), ClaudeCodeHarness())
    execution_id = "bench-ui-e0"
    TraceGenerator(ingestor, TraceConfig(seed=0, main_requests=args.requests)).run(execution_id, "bench-ui")
    events = memory.read(0, limit=10_000_000)

    with scratch_database(args.pg, "gyre_bench_ui") as url, PostgresEventLog(StoreConfig(url)) as log:
        store = store_and_project(log, events)
        view = TreeView.load(store, execution_id)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        server = uvicorn.Server(
            uvicorn.Config(create_app(log, store=store), host="127.0.0.1", port=port, log_level="warning")
        )
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.05)
        page = f"http://127.0.0.1:{port}/executions/{execution_id}"
        try:
            with httpx.Client(timeout=120) as client:

                def get() -> int:
                    response = client.get(page)
                    response.raise_for_status()
                    return len(response.content)

                first = times_of(get, 1)[0]
                size = get()
                served = times_of(get, args.repeats)
                page += f"?at={log.head()}"  # a replay: the tree folded from its records
                replayed = times_of(get, args.repeats)
        finally:
            server.should_exit = True
            thread.join(timeout=10)
        baseline = times_of(lambda: TreeView.load(store, execution_id), args.repeats)

    median, base = statistics.median(served), statistics.median(baseline)
    replay = statistics.median(replayed)
    print(
        f"execution {execution_id}: {len(view.nodes):,} tree nodes, {len(view.records):,} model calls, "
        f"{view.stats().unique_message_nodes:,} message nodes; the page is {size / 1e6:.2f} MB\n"
        f"  gyre ui, GET /executions/ID over HTTP: first {first:.3f} s (imports and tokenizer load included), "
        f"median of {len(served)} more {median:.3f} s ({min(served):.3f} to {max(served):.3f} s)\n"
        f"  baseline, TreeView.load from the projection alone: {base:.3f} s; the view takes {median / base:.1f}x it\n"
        f"  the same view as a replay (?at=POSITION, the tree folded from its records): median {replay:.3f} s, "
        f"{replay / base:.1f}x the baseline\n"
        f"  target < {TARGET_S:.0f} s: at the head median {'MET' if median < TARGET_S else 'MISSED'}, "
        f"first {'MET' if first < TARGET_S else 'MISSED'}; replay median {'MET' if replay < TARGET_S else 'MISSED'}"
    )


if __name__ == "__main__":
    main()
