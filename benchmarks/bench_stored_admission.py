"""Admission on stored trajectory trees of the paper's Appendix C size, and the J_max ablation.

Generates Claude Code-shaped executions with tracegen (about 1,350 tree nodes and 10 candidate
leaves each with the defaults), appends their records to a scratch PostgreSQL database and builds
the tree projection there, as a live run stores them. Per execution it prints the median time of
  - admit() alone (J_max = 5) on the converted tree, against one Python pass over the nodes
    (a baseline measured in the same run);
  - from the stored execution to its admitted trajectories (admission), and on to their token
    rows (admission + packing), each by two paths timed in the same run:
      new: the topology row (TreeTopology.load, no token), stored_topology, admit(); then the
           tokens of the admitted paths only (admitted_tokens) and materialize_rows;
      old: every node with its tokens (TreeView.load), stored_execution, admit(); then
           materialize_rows from the tokens already loaded;
and MET or MISSED for each against the README's target (< 5 ms per stored execution). Then the
forward-backward token fractions at J_max 1 and 5 beside the paper's 41.4% and 74.8% of uncapped
forward-backward time.

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
from gyre_store.projections import ProjectionStore
from gyre_store.trees import TrajectoryRecorder, TreeTopology, TreeView
from gyre_train.trajectories import (
    PAPER_FB_FRACTION,
    AblationSetting,
    AdmissionConfig,
    TokenRow,
    admission_rng,
    admit,
    admitted_tokens,
    materialize_rows,
    run_ablation,
    stored_execution,
    stored_topology,
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


def spread(xs: list[float]) -> str:
    return f"{min(xs) * 1e3:.2f} to {max(xs) * 1e3:.2f} ms over {len(xs)}"


def new_path(
    store: ProjectionStore, execution_id: str, config: AdmissionConfig, pack: bool
) -> tuple[TokenRow, ...]:
    """The topology row, admission; with ``pack``, the admitted paths' tokens and their rows."""
    stored = stored_topology(TreeTopology.load(store, execution_id))
    admission = admit(stored.tree, config, admission_rng(0, execution_id))
    if not pack:
        return ()
    return materialize_rows(execution_id, stored.tree, admitted_tokens(store, stored, admission), admission)


def old_path(
    store: ProjectionStore, execution_id: str, config: AdmissionConfig, pack: bool
) -> tuple[TokenRow, ...]:
    """Every node with its tokens, admission; with ``pack``, the rows from those tokens."""
    stored = stored_execution(TreeView.load(store, execution_id))
    admission = admit(stored.tree, config, admission_rng(0, execution_id))
    if not pack:
        return ()
    return materialize_rows(execution_id, stored.tree, stored.tokens, admission)


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

    paths = ("new", "old")
    ok = {(path, figure): True for path in paths for figure in ("admission", "admission + packing")}
    admit_ok = True
    with (
        scratch_database(args.pg, "gyre_bench_admission") as url,
        PostgresEventLog(StoreConfig(url)) as pg_log,
    ):
        console.print(f"storing {len(events)} records in PostgreSQL and building the tree projection ...")
        store = store_and_project(pg_log, events)
        config = AdmissionConfig(max_trajectories=5)

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
            a_ms = statistics.median(alone) * 1e3
            admit_ok &= a_ms < TARGET_MS
            rows_new, rows_old = (
                new_path(store, execution_id, config, True),
                old_path(store, execution_id, config, True),
            )
            same = len(rows_new) == len(rows_old) and all(
                (a.token_ids == b.token_ids).all() and (a.target_mask == b.target_mask).all()
                for a, b in zip(rows_new, rows_old, strict=True)
            )
            if not same:
                raise SystemExit(f"{execution_id}: the two paths admit or pack different rows")
            print(
                f"{execution_id}: {tree.num_nodes} nodes, {len(tree.leaves)} leaves, "
                f"{int(tree.trainable_counts.sum())} trainable tokens, {len(rows_new)} admitted rows "
                f"({sum(len(r) for r in rows_new):,} tokens; both paths give the same rows)\n"
                f"  admit() alone, J_max=5:           {ms(alone)}  "
                f"({statistics.median(alone) / statistics.median(baseline):.1f}x one pass over the nodes, "
                f"{ms(baseline)}); target < {TARGET_MS:.0f} ms: {'MET' if a_ms < TARGET_MS else 'MISSED'}"
            )
            whole: dict[tuple[str, bool], list[float]] = {}
            for pack in (False, True):
                for path, fn in (("new", new_path), ("old", old_path)):
                    whole[path, pack] = times_of(
                        lambda f=fn, e=execution_id, k=pack: f(store, e, config, k), args.stored_repeats
                    )
            for pack in (False, True):
                figure = "admission + packing" if pack else "admission"
                new_ms, old_ms = (statistics.median(whole[p, pack]) * 1e3 for p in paths)
                for path, value in zip(paths, (new_ms, old_ms), strict=True):
                    ok[path, figure] &= value < TARGET_MS
                print(
                    f"  stored execution -> {'rows' if pack else 'admitted'} ({figure}): "
                    f"new {new_ms:.2f} ms ({spread(whole['new', pack])}) "
                    f"{'MET' if new_ms < TARGET_MS else 'MISSED'}; "
                    f"old {old_ms:.1f} ms ({spread(whole['old', pack])}) "
                    f"{'MET' if old_ms < TARGET_MS else 'MISSED'}; "
                    f"{old_ms / new_ms:.0f}x faster; target < {TARGET_MS:.0f} ms"
                )
    print(f"every execution: admit() alone {'MET' if admit_ok else 'MISSED'} (target < {TARGET_MS:.0f} ms)")
    for figure in ("admission", "admission + packing"):
        print(
            f"every execution, {figure}: new {'MET' if ok['new', figure] else 'MISSED'}, "
            f"old {'MET' if ok['old', figure] else 'MISSED'} (target < {TARGET_MS:.0f} ms)"
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
