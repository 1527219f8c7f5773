"""Admission on stored trajectory trees of the paper's Appendix C size, and the J_max ablation.

Generates Claude Code-shaped executions with tracegen (about 1,350 tree nodes and 10 candidate
leaves each with the defaults), appends their records to a scratch PostgreSQL database and builds
the tree projection there, as a live run stores them. Per execution it prints the median time of
  - admit() alone (J_max = 5) on the converted tree, against one Python pass over the nodes
    (a baseline measured in the same run);
  - from the stored execution to its admitted trajectories: loading the tree from PostgreSQL
    (TreeView.load), converting it (stored_execution) and admit(), timed as one call sequence,
    with the median of each part beside it;
and MET or MISSED for both against the README's target (< 5 ms). Then the forward-backward token
fractions at J_max 1 and 5 beside the paper's 41.4% and 74.8% of uncapped forward-backward time.

    .venv/bin/python benchmarks/bench_stored_admission.py [--executions 4] [--requests 520] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

from rich.console import Console
from rich.progress import Progress
from scratch import scratch_database
from stored_trees import store_and_project

from gyre_proxy.engines import qwen_tokenizer
from gyre_proxy.harness import ClaudeCodeHarness
from gyre_proxy.ingest import Ingestor, Qwen3Template, TraceConfig, TraceGenerator
from gyre_store import InMemoryEventLog, PostgresEventLog, StoreConfig
from gyre_store.trees import TrajectoryRecorder, TreeView
from gyre_train import (
    PAPER_FB_FRACTION,
    AblationSetting,
    AdmissionConfig,
    admission_rng,
    admit,
    run_ablation,
    stored_execution,
)

TARGET_MS = 5.0  # admission of one stored execution < 5 ms
console = Console(width=160)


def times_of(fn: Callable[[], object], repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def ms(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1e3:.3f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--executions", type=int, default=4)
    parser.add_argument("--requests", type=int, default=520, help="main-agent requests per execution")
    parser.add_argument("--repeats", type=int, default=200, help="repeats of admit() alone")
    parser.add_argument("--stored-repeats", type=int, default=20, help="repeats from the stored execution")
    parser.add_argument("--quick", action="store_true", help="2 executions, 50 and 10 repeats")
    parser.add_argument(
        "--pg", default=os.environ.get("GYRE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
    )
    args = parser.parse_args()
    if args.quick:
        args.executions, args.repeats, args.stored_repeats = 2, 50, 10

    log = InMemoryEventLog()
    ingestor = Ingestor(TrajectoryRecorder(log), Qwen3Template(qwen_tokenizer()), ClaudeCodeHarness())
    ids = [f"bench-e{i}" for i in range(args.executions)]
    with Progress(console=console) as progress:
        task = progress.add_task("tracegen executions", total=len(ids))
        for i, execution_id in enumerate(ids):
            TraceGenerator(ingestor, TraceConfig(seed=i, main_requests=args.requests)).run(
                execution_id, "bench"
            )
            progress.advance(task)
    events = log.read(0, limit=10_000_000)

    admit_ok = stored_ok = True
    with (
        scratch_database(args.pg, "gyre_bench_admission") as url,
        PostgresEventLog(StoreConfig(url)) as pg_log,
    ):
        console.print(f"storing {len(events)} records in PostgreSQL and building the tree projection ...")
        store = store_and_project(pg_log, events)
        config = AdmissionConfig(max_trajectories=5)

        def from_stored(execution_id: str) -> object:
            stored = stored_execution(TreeView.load(store, execution_id))
            return admit(stored.tree, config, admission_rng(0, execution_id))

        executions = []
        for execution_id in ids:
            view = TreeView.load(store, execution_id)
            stored = stored_execution(view)
            executions.append(stored)
            tree = stored.tree
            parents, counts = tree.parents.tolist(), tree.trainable_counts.tolist()
            baseline = times_of(lambda p=parents, c=counts: sum(x for x, y in zip(c, p, strict=True) if y >= 0),
                                args.repeats)  # fmt: skip
            rng = admission_rng(0, execution_id)
            alone = times_of(lambda t=tree, r=rng: admit(t, config, r), args.repeats)
            whole = times_of(lambda e=execution_id: from_stored(e), args.stored_repeats)
            load = times_of(lambda e=execution_id: TreeView.load(store, e), args.stored_repeats)
            convert = times_of(lambda v=view: stored_execution(v), args.stored_repeats)
            a_ms, w_ms = statistics.median(alone) * 1e3, statistics.median(whole) * 1e3
            admit_ok &= a_ms < TARGET_MS
            stored_ok &= w_ms < TARGET_MS
            print(
                f"{execution_id}: {tree.num_nodes} nodes, {len(tree.leaves)} leaves, "
                f"{int(tree.trainable_counts.sum())} trainable tokens\n"
                f"  admit() alone, J_max=5:           {ms(alone)}  "
                f"({statistics.median(alone) / statistics.median(baseline):.1f}x one pass over the nodes, "
                f"{ms(baseline)}); target < {TARGET_MS:.0f} ms: {'MET' if a_ms < TARGET_MS else 'MISSED'}\n"
                f"  stored execution -> admitted:     {ms(whole)}  (load from PostgreSQL {ms(load)}, "
                f"convert {ms(convert)}, admit {ms(alone)}; "
                f"{min(whole) * 1e3:.1f} to {max(whole) * 1e3:.1f} ms over {len(whole)}); "
                f"target < {TARGET_MS:.0f} ms: {'MET' if w_ms < TARGET_MS else 'MISSED'}"
            )
    print(
        f"every execution: admit() alone {'MET' if admit_ok else 'MISSED'}, "
        f"stored execution -> admitted {'MET' if stored_ok else 'MISSED'} (target < {TARGET_MS:.0f} ms)"
    )

    settings = [
        AblationSetting(f"J_max={c}", AdmissionConfig(max_trajectories=c), "J_max=None") for c in (1, 5, None)
    ]
    report = run_ablation(executions, settings)
    for s in report.summaries:
        paper = PAPER_FB_FRACTION.get(s.max_trajectories) if s.max_trajectories else 1.0
        print(
            f"{s.setting}: {s.trajectories} trajectories, {s.covered_fraction:.1%} of trainable tokens, "
            f"forward-backward tokens {s.fb_token_fraction:.1%} of uncapped "
            f"(attention {s.fb_attention_fraction:.1%}); paper: {paper:.1%} of uncapped fb time"
        )


if __name__ == "__main__":
    main()
