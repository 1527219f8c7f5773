"""Trajectory-tree benchmarks on tracegen executions, ratios from one run.

    .venv/bin/python benchmarks/bench_trees.py [--requests 470] [--pg URL]

1. tokens stored against the unique tokens of all records (computed independently by
   hashing every prefix) and against storing each record's full input;
2. tokens tokenized during ingest against the new tokens, and ingest time against the
   naive path that re-tokenizes every full context and re-matches it on tokens;
3. rebuilding records' inputs from the tree: time per record against path length, and
   rebuilding all records of an execution against reading them back from naive storage
   (one row of full input tokens per record) in the same PostgreSQL.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import psycopg
from psycopg import sql
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gyre_proxy.chat import ChatRequest
from gyre_proxy.engines import qwen_tokenizer
from gyre_proxy.harness import ClaudeCodeHarness
from gyre_proxy.ingest import (
    Ingestor,
    Prepared,
    Qwen3Template,
    Rendered,
    TraceConfig,
    TraceGenerator,
    full_messages,
)
from gyre_store import InMemoryEventLog, PostgresEventLog, PostgresProjectionStore, StoreConfig, catch_up
from gyre_store.catalog import TitoArrays
from gyre_store.db import migrate
from gyre_store.trees import TrajectoryRecorder, TreeProjection, TreeView

console = Console()


class CapturingIngestor(Ingestor):
    """Records the requests tracegen makes, so the naive path can replay the same ones."""

    def __init__(self, *a: object, **k: object) -> None:
        super().__init__(*a, **k)  # type: ignore[arg-type]
        self.requests: list[ChatRequest] = []

    def prepare(self, execution_id: str, run_id: str, request: ChatRequest) -> Prepared:
        self.requests.append(request)
        return super().prepare(execution_id, run_id, request)


def unique_prefixes(seqs: list[np.ndarray]) -> int:
    """Distinct token prefixes over all sequences: a token trie's size, by hashing.

    G_i = sum_j t_j * B^-j over Z/2^64 (B odd, so invertible) identifies prefix i together
    with its length; collisions are negligible at 64 bits.
    """
    base = np.uint64(0x9E3779B97F4A7C15)
    inv = np.uint64(pow(int(base), -1, 2**64))
    longest = max(len(s) for s in seqs)
    powers = np.empty(longest, dtype=np.uint64)
    powers[0] = 1
    with np.errstate(over="ignore"):
        for i in range(1, longest):
            powers[i] = powers[i - 1] * inv
        keys = []
        for s in seqs:
            g = np.cumsum((s.astype(np.uint64) + np.uint64(1)) * powers[: len(s)], dtype=np.uint64)
            keys.append(g ^ (np.arange(len(s), dtype=np.uint64) * np.uint64(0xD6E8FEB86659FD93)))
    return int(np.unique(np.concatenate(keys)).shape[0])


def naive_ingest(
    template: Qwen3Template, requests: list[ChatRequest], outputs: list[np.ndarray]
) -> tuple[float, int]:
    """Re-render every full context and match it on tokens against the previous sequences."""
    began = time.perf_counter()
    stored: list[np.ndarray] = []
    tokenized = 0
    for req, out in zip(requests, outputs, strict=True):
        msgs = full_messages(req)
        whole: Rendered = template.render_system(req.system, req.tools)
        for m in msgs[1:]:
            whole.ids.extend(template.render_message(m).ids)
        whole.ids.extend(template.generation_prompt(thinking=req.thinking).ids)
        ids = np.asarray(whole.ids, dtype=np.int32)
        tokenized += len(ids)
        for prev in stored[-8:]:  # re-match on tokens against recent contexts
            m = min(len(prev), len(ids))
            _ = int(np.argmax(prev[:m] != ids[:m])) if m else 0
        stored.append(np.concatenate([ids, out]))
    return time.perf_counter() - began, tokenized


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=470, help="main-agent requests (total is larger)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--pg", default=os.environ.get("GYRE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
    )
    args = parser.parse_args()
    template = Qwen3Template(qwen_tokenizer())

    log = InMemoryEventLog()
    ing = CapturingIngestor(TrajectoryRecorder(log), template, ClaudeCodeHarness())
    began = time.perf_counter()
    gen = TraceGenerator(ing, TraceConfig(seed=args.seed, main_requests=args.requests))
    gen.run("bench", "bench")
    ours_s = time.perf_counter() - began
    events = log.read(0, limit=1_000_000)
    arrays = [TitoArrays.from_payload(e.payload) for e in events]
    outputs = [a.output_ids for a in arrays]

    full: dict[str, np.ndarray] = {}
    inputs: list[np.ndarray] = []
    for ev, a in zip(events, arrays, strict=True):
        e = ev.event
        prefix = full[e.prefix_of][: e.prefix_len] if e.prefix_of else np.zeros(0, np.int32)  # type: ignore[attr-defined]
        inp = np.concatenate([prefix, a.input_ids])
        inputs.append(inp)
        full[e.request_id] = np.concatenate([inp, a.output_ids])  # type: ignore[attr-defined]
    unique = unique_prefixes(list(full.values()))

    naive_s, naive_tok = naive_ingest(template, ing.requests, outputs)
    # the generator itself (text synthesis) is part of ours_s: time it alone to be fair
    began = time.perf_counter()
    TraceGenerator(_NullIngestor(template), TraceConfig(seed=args.seed, main_requests=args.requests)).run(
        "x", "x"
    )
    synth_s = time.perf_counter() - began
    ours_ingest_s = max(ours_s - synth_s, 1e-9)

    name = f"gyre_bench_trees_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.pg, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = args.pg.rsplit("/", 1)[0] + "/" + name
    try:
        migrate.upgrade(url)
        with PostgresEventLog(StoreConfig(url)) as pg_log:
            for i in range(0, len(events), 64):
                pg_log.append([_renew(e) for e in events[i : i + 64]])
            p = TreeProjection()
            store = PostgresProjectionStore(pg_log.pool, {t.name: t for t in p.tables})
            catch_up(pg_log, store, p)
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("CREATE TABLE naive_inputs (request_id text PRIMARY KEY, tokens bytea)")
                with conn.cursor() as cur:
                    cur.executemany(
                        "INSERT INTO naive_inputs VALUES (%s, %s)",
                        [
                            (ev.event.request_id, inp.tobytes())
                            for ev, inp in zip(events, inputs, strict=True)
                        ],  # type: ignore[attr-defined]
                    )
                began = time.perf_counter()
                rows = conn.execute("SELECT request_id, tokens FROM naive_inputs").fetchall()
                naive_back = {r: np.frombuffer(b, dtype=np.int32) for r, b in rows}
                naive_read_s = time.perf_counter() - began
            began = time.perf_counter()
            view = TreeView.load(store, "bench")
            rebuilt = {rid: view.input_of(rid)[0] for rid in view.records}
            tree_read_s = time.perf_counter() - began
            assert all(np.array_equal(rebuilt[r], naive_back[r]) for r in rebuilt)
            per_record = []
            for rid, rec in view.records.items():
                t = time.perf_counter()
                view.input_of(rid)
                per_record.append((len(view.path(rec.end_node)), time.perf_counter() - t))
    finally:
        with psycopg.connect(args.pg, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    stats = view.stats()
    stored = stats.unique_tokens
    full_inputs = sum(len(x) for x in inputs)
    new_tokens = gen.new_tokens
    path_len = np.array([p for p, _ in per_record], dtype=float)
    times = np.array([t for _, t in per_record])
    table = Table(title=f"trajectory trees: one tracegen execution, {stats.requests} requests")
    for c in ("figure", "measured", "baseline (same run)", "ratio", "target"):
        table.add_column(c)
    table.add_row(
        "tokens stored",
        f"{stored:,}",
        f"{unique:,} unique (prefix hashing)",
        f"{stored / unique:.3f}",
        "<= 1.02",
    )
    table.add_row(
        "tokens stored vs full inputs",
        f"{stored:,}",
        f"{full_inputs:,} (every record's full input)",
        f"{full_inputs / stored:.1f}x fewer",
        ">= 20x",
    )
    table.add_row(
        "tokens tokenized at ingest",
        f"{gen.tokenized:,}",
        f"{new_tokens:,} new input tokens",
        f"{gen.tokenized / new_tokens:.3f}",
        "<= 1.10",
    )
    table.add_row(
        "naive path tokenized",
        f"{naive_tok:,}",
        f"{gen.tokenized:,} (ours)",
        f"{naive_tok / gen.tokenized:.1f}x more",
        "",
    )
    table.add_row(
        "ingest time (s)",
        f"{ours_ingest_s:.2f}",
        f"{naive_s:.2f} (naive re-tokenize + re-match)",
        f"{naive_s / ours_ingest_s:.1f}x faster",
        ">= 10x",
    )
    table.add_row(
        "rebuild all record inputs (s)",
        f"{tree_read_s:.3f}",
        f"{naive_read_s:.3f} (read naive rows back)",
        f"{naive_read_s / tree_read_s:.2f}x",
        "> 1x",
    )
    slope = float(np.polyfit(path_len, times * 1e6, 1)[0]) if len(set(path_len)) > 1 else 0.0
    table.add_row(
        "rebuild one input",
        f"{times.mean() * 1e6:.0f} us mean",
        f"{path_len.mean():.1f} nodes on path (max {int(path_len.max())})",
        f"{slope:.2f} us per node",
        "O(path)",
    )
    console.print(table)
    return 0


class _NullIngestor(Ingestor):
    """Times text synthesis alone: prepares nothing, records nothing."""

    def __init__(self, template: Qwen3Template) -> None:
        super().__init__(TrajectoryRecorder(InMemoryEventLog()), template, ClaudeCodeHarness())

    def prepare(self, execution_id: str, run_id: str, request: ChatRequest) -> Prepared:
        from gyre_proxy.harness import CallTraits
        from gyre_proxy.ingest import EncodedRequest
        from gyre_store.catalog import AgentKind, CallPurpose

        z = np.zeros(0, np.int32)
        enc = EncodedRequest(None, z, np.zeros(0, np.uint8), z, np.zeros(0, np.uint32), (), (), b"", "", 0)
        return Prepared(execution_id, run_id, request, enc, CallTraits(AgentKind.MAIN, "", CallPurpose.TURN))

    def record(self, prepared: Prepared, **kw: object) -> object:  # type: ignore[override]
        return None


def _renew(ev: object) -> object:
    from gyre_store import NewEvent

    return NewEvent(ev.event, idempotency_key=ev.idempotency_key, payload=ev.payload)  # type: ignore[attr-defined]


if __name__ == "__main__":
    sys.exit(main())
