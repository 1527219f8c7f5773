"""Admission on stored trajectory trees of the paper's Appendix C size, and the J_max ablation.

Generates Claude Code-shaped executions with tracegen into an in-memory store (about 1,350 tree
nodes and 10 candidate leaves each with the defaults), converts each stored tree into admission
input, and prints the median admission time (J_max = 5) against a baseline measured in the same
run (one Python pass over the nodes), then the forward-backward token fractions at J_max 1 and 5
beside the paper's 41.4% and 74.8% of uncapped forward-backward time.
Run: .venv/bin/python benchmarks/bench_stored_admission.py [--executions 4] [--requests 520]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from gyre_proxy.engines import qwen_tokenizer
from gyre_proxy.harness import ClaudeCodeHarness
from gyre_proxy.ingest import Ingestor, Qwen3Template, TraceConfig, TraceGenerator
from gyre_store import InMemoryEventLog, InMemoryProjectionStore, catch_up
from gyre_store.trees import TrajectoryRecorder, TreeProjection, TreeView
from gyre_train import (
    PAPER_FB_FRACTION,
    AblationSetting,
    AdmissionConfig,
    admission_rng,
    admit,
    run_ablation,
    stored_execution,
)


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--executions", type=int, default=4)
    parser.add_argument("--requests", type=int, default=520, help="main-agent requests per execution")
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()

    log = InMemoryEventLog()
    ingestor = Ingestor(TrajectoryRecorder(log), Qwen3Template(qwen_tokenizer()), ClaudeCodeHarness())
    ids = [f"bench-e{i}" for i in range(args.executions)]
    for i, execution_id in enumerate(ids):
        TraceGenerator(ingestor, TraceConfig(seed=i, main_requests=args.requests)).run(execution_id, "bench")
    projection = TreeProjection()
    store = InMemoryProjectionStore({t.name: t for t in projection.tables})
    catch_up(log, store, projection)
    views = [TreeView.load(store, e) for e in ids]
    executions = [stored_execution(v) for v in views]

    for view, stored in zip(views, executions, strict=True):
        tree = stored.tree
        parents, counts = tree.parents.tolist(), tree.trainable_counts.tolist()
        baseline = median_seconds(lambda p=parents, c=counts: sum(x for x, y in zip(c, p, strict=True) if y >= 0),
                                  args.repeats)  # fmt: skip
        convert = median_seconds(lambda v=view: stored_execution(v), max(5, args.repeats // 20))
        config, rng = AdmissionConfig(max_trajectories=5), admission_rng(0, stored.execution_id)
        elapsed = median_seconds(lambda t=tree, c=config, r=rng: admit(t, c, r), args.repeats)
        print(
            f"{stored.execution_id}: {tree.num_nodes} nodes, {len(tree.leaves)} leaves, "
            f"{int(tree.trainable_counts.sum())} trainable tokens; admit J_max=5 {elapsed * 1e3:.3f} ms "
            f"({elapsed / baseline:.1f}x one pass over the nodes); TreeView -> admission input "
            f"{convert * 1e3:.1f} ms"
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
