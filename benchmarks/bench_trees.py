"""Trajectory-tree benchmarks on one tracegen execution, every ratio from one run.

    .venv/bin/python benchmarks/bench_trees.py [--requests 470] [--repeats 3] [--quick] [--pg URL]

1. Storage. Tokens in the tree projection against the unique tokens of all records (a trie's
   size by prefix hashing, computed apart from the tree). Bytes: every copy PostgreSQL holds of
   the execution (the log table with its payloads, JSON bodies and indexes, and the three tree
   projection tables), from pg_total_relation_size, against a table holding every record's full
   input tokens (one bytea row per record) in the same database. Two layouts, same run: the
   migrated one (payloads compressed, migration 0007; tree nodes referring to the payloads'
   ids, provenance, logprobs and trainable masks instead of copying them, 0008) and the one
   before 0008 (a copy of the node table with those arrays copied back in from the payloads,
   stored as 0007 stored them, measured beside the migrated tables).
2. Re-tokenization. A counting wrapper around the tokenizer counts the calls made inside
   ``Ingestor.prepare``/``record`` and the tokens they return; the baseline is the input tokens
   new to the tree, found by a separate walk over the recorded inputs in log order (prefix
   hashes of everything stored before each record).
3. Ingest time: the time spent inside ``Ingestor.prepare``/``record`` (timed directly around
   those calls; text synthesis and the simulated engine's output rendering are outside) against
   the naive path, re-rendering every full context and re-matching it on tokens, replaying the
   very same requests. Repeated ``--repeats`` times with the same seed; median and range printed.
4. Rebuilding every record's input from the tree against reading naive full-input rows back.

Each target row ends with MET or MISSED; the targets are the README's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import psycopg
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scratch import scratch_database
from stored_trees import store_and_project

from gyre_proxy.chat import ChatRequest
from gyre_proxy.engines import Tokenizer, qwen_tokenizer
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
from gyre_store import InMemoryEventLog, PostgresEventLog, StoreConfig
from gyre_store.catalog import TitoArrays
from gyre_store.log import AppendResult
from gyre_store.trees import TrajectoryRecorder, TreeView

console = Console(width=170)
TREE_TABLES = ("gyre_tree_nodes", "gyre_tree_records", "gyre_tree_state")

# The README's targets: (figure, comparison, bound).
TARGET_STORED_UNIQUE = 1.02  # tokens stored / unique tokens <=
TARGET_FEWER = 20.0  # bytes of every full input / bytes PostgreSQL holds >=
TARGET_TOKENIZED = 1.10  # tokens the tokenizer returned at ingest / new tokens <=
TARGET_INGEST = 10.0  # naive ingest time / ours >=
TARGET_REBUILD = 1.0  # naive read-back time / tree rebuild >
SQL_SAMPLE = 20  # records whose input is also rebuilt by gyre_record_input_v1 and compared


class CountingTokenizer:
    """The tokenizer with a counter: calls to ``encode`` and the tokens returned, while on."""

    def __init__(self, inner: Tokenizer) -> None:
        self._inner = inner
        self.name = inner.name
        self.counting = False
        self.calls = 0
        self.tokens = 0

    def encode(self, text: str) -> list[int]:
        ids = self._inner.encode(text)
        if self.counting:
            self.calls += 1
            self.tokens += len(ids)
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._inner.decode(ids)

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        return self._inner.decode_bytes(ids)

    def special(self, token: str) -> int:
        return self._inner.special(token)

    @property
    def specials(self) -> Mapping[str, int]:
        return self._inner.specials

    def byte_lengths(self, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        return self._inner.byte_lengths(ids)

    @property
    def vocab_size(self) -> int:
        return self._inner.vocab_size


class TimedIngestor(Ingestor):
    """Times ``prepare`` and ``record`` directly, counts the tokenizer inside them, and keeps
    the requests so the naive path can replay the same ones."""

    def __init__(self, recorder: TrajectoryRecorder, template: Qwen3Template, tok: CountingTokenizer) -> None:
        super().__init__(recorder, template, ClaudeCodeHarness())
        self.tok = tok
        self.requests: list[ChatRequest] = []
        self.seconds = 0.0

    def prepare(self, execution_id: str, run_id: str, request: ChatRequest, match: Any = None) -> Prepared:
        self.requests.append(request)
        self.tok.counting = True
        began = time.perf_counter()
        try:
            return super().prepare(execution_id, run_id, request, match)
        finally:
            self.seconds += time.perf_counter() - began
            self.tok.counting = False

    def record(self, prepared: Prepared, **kwargs: Any) -> AppendResult:
        self.tok.counting = True
        began = time.perf_counter()
        try:
            return super().record(prepared, **kwargs)
        finally:
            self.seconds += time.perf_counter() - began
            self.tok.counting = False


def prefix_keys(seq: npt.NDArray[np.int32], powers: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """One 64-bit key per prefix of ``seq`` (prefix i with its length), by polynomial hashing.

    G_i = sum_j (t_j + 1) * B^-j over Z/2^64 (B odd, so invertible), mixed with the length;
    collisions are negligible at 64 bits.
    """
    with np.errstate(over="ignore"):
        g = np.cumsum((seq.astype(np.uint64) + np.uint64(1)) * powers[: len(seq)], dtype=np.uint64)
        return g ^ (np.arange(len(seq), dtype=np.uint64) * np.uint64(0xD6E8FEB86659FD93))


def hash_powers(longest: int) -> npt.NDArray[np.uint64]:
    inv = np.uint64(pow(0x9E3779B97F4A7C15, -1, 2**64))
    powers = np.empty(max(longest, 1), dtype=np.uint64)
    powers[0] = 1
    with np.errstate(over="ignore"):
        for i in range(1, longest):
            powers[i] = powers[i - 1] * inv
    return powers


@dataclass(frozen=True, slots=True)
class Walk:
    unique_tokens: int  # distinct prefixes over every record's input + output
    new_input_tokens: int  # input tokens whose prefix nothing stored before had


def separate_walk(inputs: list[npt.NDArray[np.int32]], outputs: list[npt.NDArray[np.int32]]) -> Walk:
    """Walk the records in log order over a set of prefix keys, apart from the tree's code.

    The keys of everything stored so far are prefix-closed, so the part of a new input already
    stored is the longest prefix whose key is known: found by bisection.
    """
    powers = hash_powers(max(len(i) + len(o) for i, o in zip(inputs, outputs, strict=True)))
    known: set[int] = set()
    new = 0
    for inp, out in zip(inputs, outputs, strict=True):
        keys = prefix_keys(np.concatenate([inp, out]), powers)
        lo, hi = 0, len(inp)  # the first lo tokens are known; find the largest such lo
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if int(keys[mid - 1]) in known:
                lo = mid
            else:
                hi = mid - 1
        new += len(inp) - lo
        known.update(keys[lo:].tolist())
    return Walk(len(known), new)


def naive_ingest(
    template: Qwen3Template, requests: list[ChatRequest], outputs: list[npt.NDArray[np.int32]]
) -> tuple[float, int]:
    """Re-render every full context and match it on tokens against the previous sequences."""
    began = time.perf_counter()
    stored: list[npt.NDArray[np.int32]] = []
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


@dataclass
class IngestRun:
    ours_s: float
    naive_s: float
    tokenizer_calls: int
    tokenizer_tokens: int
    naive_calls: int
    naive_tokens: int
    ingestor_count: int  # the ingestor's own count of tokens it tokenized (the old figure)
    log: InMemoryEventLog


def ingest_once(tok: CountingTokenizer, config: TraceConfig, progress: Progress, label: str) -> IngestRun:
    template = Qwen3Template(tok)
    log = InMemoryEventLog()
    ing = TimedIngestor(TrajectoryRecorder(log), template, tok)
    task = progress.add_task(f"{label}: tracegen through the ingestor", total=None)
    tok.calls = tok.tokens = 0
    gen = TraceGenerator(ing, config, progress=lambda n: progress.update(task, completed=n))
    gen.run("bench", "bench")
    calls, tokens = tok.calls, tok.tokens
    progress.update(task, description=f"{label}: naive re-tokenize + re-match")
    tok.calls = tok.tokens = 0
    tok.counting = True
    # prepare and record alternate, so the log's records line up with the captured requests
    outputs = [TitoArrays.from_payload(e.payload).output_ids for e in log.read(0, limit=1_000_000)]
    naive_s, naive_tok = naive_ingest(template, ing.requests, outputs)
    tok.counting = False
    progress.update(task, description=f"{label}: done", total=gen.requests, completed=gen.requests)
    return IngestRun(ing.seconds, naive_s, calls, tokens, tok.calls, naive_tok, gen.tokenized, log)


def spread(xs: list[float], fmt: str) -> str:
    return f"{format(statistics.median(xs), fmt)} ({format(min(xs), fmt)} to {format(max(xs), fmt)})"


def verdict(ok: bool) -> str:
    return "[green]MET[/]" if ok else "[red]MISSED[/]"


def sizes(conn: psycopg.Connection[Any], tables: Sequence[str]) -> dict[str, int]:
    out = {}
    for t in tables:
        row = conn.execute("SELECT pg_total_relation_size(%s::regclass)", (t,)).fetchone()
        out[t] = int(row[0]) if row else 0
    return out


def copying_tree_bytes(conn: psycopg.Connection[Any]) -> int:
    """Bytes of gyre_tree_nodes as it was before migration 0008, each node holding copies of its
    arrays: the same rows with the token ids, provenance, logprobs and trainable mask taken from
    the payloads they refer to, stored as 0007 stored them (compressed, toast_tuple_target 128),
    with the same indexes."""

    def copied(at: str, width: int) -> str:
        return (
            f"CASE WHEN n.{at} IS NULL THEN NULL "
            f"ELSE substring(e.payload FROM n.{at} + 1 FOR {width} * n.n_tokens) END"
        )

    conn.execute(
        "CREATE TABLE copy_tree_nodes AS SELECT n.execution_id, n.node_id, n.parent_id, n.root_id, "
        f"n.kind, n.start, n.n_tokens, {copied('tokens_at', 4)} AS tokens, "
        f"{copied('provenance_at', 1)} AS provenance, {copied('logprobs_at', 4)} AS logprobs, "
        f"{copied('trainable_at', 1)} AS trainable, n.msg_ends, n.path_trainable, n.path_messages, "
        "n.children, n.request_id FROM gyre_tree_nodes n JOIN gyre_events e ON e.position = n.position"
    )
    conn.execute("ALTER TABLE copy_tree_nodes ALTER COLUMN tokens SET STORAGE EXTENDED")
    conn.execute("ALTER TABLE copy_tree_nodes SET (toast_tuple_target = 128)")
    conn.execute("VACUUM FULL copy_tree_nodes")  # rewrite the rows under the settings above
    conn.execute("ALTER TABLE copy_tree_nodes ADD PRIMARY KEY (execution_id, node_id)")
    conn.execute("CREATE INDEX ON copy_tree_nodes (execution_id, parent_id)")
    conn.execute("VACUUM ANALYZE copy_tree_nodes")
    return sizes(conn, ("copy_tree_nodes",))["copy_tree_nodes"]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=470, help="main-agent requests (total is larger)")
    parser.add_argument("--repeats", type=int, default=3, help="ingest runs, same seed, for the spread")
    parser.add_argument("--quick", action="store_true", help="120 main-agent requests, 2 repeats")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--pg", default=os.environ.get("GYRE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
    )
    args = parser.parse_args()
    if args.quick:
        args.requests, args.repeats = 120, 2
    tok = CountingTokenizer(qwen_tokenizer())
    config = TraceConfig(seed=args.seed, main_requests=args.requests)

    runs: list[IngestRun] = []
    with Progress(console=console, transient=False) as progress:
        for r in range(args.repeats):
            runs.append(ingest_once(tok, config, progress, f"run {r + 1}/{args.repeats}"))
    first = runs[0]
    counts = {(r.tokenizer_calls, r.tokenizer_tokens, r.naive_tokens) for r in runs}
    if len(counts) != 1:
        raise SystemExit(f"the repeats differ in what they tokenized: {counts}")

    events = first.log.read(0, limit=1_000_000)
    arrays = [TitoArrays.from_payload(e.payload) for e in events]
    full: dict[str, npt.NDArray[np.int32]] = {}
    inputs: list[npt.NDArray[np.int32]] = []
    for ev, a in zip(events, arrays, strict=True):
        e: Any = ev.event
        prefix = full[e.prefix_of][: e.prefix_len] if e.prefix_of else np.zeros(0, np.int32)
        inp = np.concatenate([prefix, a.input_ids])
        inputs.append(inp)
        full[e.request_id] = np.concatenate([inp, a.output_ids])
    console.print(f"walking {len(events)} records apart from the tree ...")
    walk = separate_walk(inputs, [a.output_ids for a in arrays])

    tree_reads: list[float] = []
    naive_reads: list[float] = []
    with scratch_database(args.pg, "gyre_bench_trees") as url:
        console.print(
            f"storing {len(events)} records in PostgreSQL (scratch database {url.rsplit('/', 1)[1]}) ..."
        )
        with PostgresEventLog(StoreConfig(url)) as pg_log:
            store = store_and_project(pg_log, events)
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("CREATE TABLE naive_inputs (request_id text PRIMARY KEY, tokens bytea)")
                with conn.cursor() as cur:
                    cur.executemany(
                        "INSERT INTO naive_inputs VALUES (%s, %s)",
                        [
                            (ev.event.request_id, inp.tobytes())
                            for ev, inp in zip(events, inputs, strict=True)
                        ],
                    )
                conn.execute("VACUUM ANALYZE")
                ours_bytes = sizes(conn, ("gyre_events", *TREE_TABLES))
                naive_bytes = sizes(conn, ("naive_inputs",))["naive_inputs"]
                copy_nodes = copying_tree_bytes(conn)
                row = conn.execute(
                    "SELECT count(*), coalesce(sum(pg_column_size(payload)), 0), "
                    "coalesce(sum(octet_length(payload)), 0), coalesce(sum(pg_column_size(body)), 0) "
                    "FROM gyre_events"
                ).fetchone()
                assert row is not None
                log_rows, payload_bytes, payload_raw, body_bytes = (int(x) for x in row)
                row = conn.execute("SELECT sum(octet_length(tokens)) FROM naive_inputs").fetchone()
                naive_raw = int(row[0]) if row else 0
                for _ in range(args.repeats):
                    began = time.perf_counter()
                    rows = conn.execute("SELECT request_id, tokens FROM naive_inputs").fetchall()
                    naive_back = {r: np.frombuffer(b, dtype=np.int32) for r, b in rows}
                    naive_reads.append(time.perf_counter() - began)
                    began = time.perf_counter()
                    view = TreeView.load(store, "bench")
                    rebuilt = {rid: view.input_of(rid)[0] for rid in view.records}
                    tree_reads.append(time.perf_counter() - began)
                sample = sorted(view.records)[:: max(1, len(view.records) // SQL_SAMPLE)]
                sql_rebuilt = {
                    rid: np.asarray(
                        conn.execute("SELECT gyre_record_input_v1('bench', %s)", (rid,)).fetchone()[0]
                    )  # type: ignore[index]
                    for rid in sample
                }
            if rebuilt.keys() != naive_back.keys() or not all(
                np.array_equal(rebuilt[r], naive_back[r]) for r in rebuilt
            ):
                raise SystemExit("the tree does not rebuild every record's input exactly")
            if not all(np.array_equal(sql_rebuilt[r], naive_back[r]) for r in sql_rebuilt):
                raise SystemExit("gyre_record_input_v1 does not rebuild a record's input exactly")
            per_record = []
            for rid, rec in view.records.items():
                t = time.perf_counter()
                view.input_of(rid)
                per_record.append((len(view.path(rec.end_node)), time.perf_counter() - t))
    stats = view.stats()
    stored = stats.unique_tokens
    full_inputs = sum(len(x) for x in inputs)
    ours_total = sum(ours_bytes.values())
    table = Table(
        title=f"trajectory trees: one tracegen execution, {stats.requests} requests, seed {args.seed}"
    )
    for c in ("figure", "measured", "baseline (same run)", "ratio", "target", "verdict"):
        table.add_column(c)
    table.add_row(
        "tokens in the tree projection",
        f"{stored:,}",
        f"{walk.unique_tokens:,} unique (prefix hashing)",
        f"{stored / walk.unique_tokens:.3f}",
        f"<= {TARGET_STORED_UNIQUE}",
        verdict(stored / walk.unique_tokens <= TARGET_STORED_UNIQUE),
    )
    table.add_row(
        "bytes PostgreSQL holds (log + tree)",
        f"{ours_total / 1e6:.2f} MB",
        f"{naive_bytes / 1e6:.2f} MB (every record's full input, one row each; "
        f"{naive_raw / 1e6:.1f} MB of int32 tokens before TOAST compression)",
        f"{naive_bytes / ours_total:.1f}x fewer",
        f">= {TARGET_FEWER:.0f}x",
        verdict(naive_bytes / ours_total >= TARGET_FEWER),
    )
    copy_total = ours_total - ours_bytes["gyre_tree_nodes"] + copy_nodes
    table.add_row(
        "  as before 0008: tree nodes copying their arrays out of the payloads",
        f"{copy_total / 1e6:.2f} MB",
        f"{naive_bytes / 1e6:.2f} MB (the same table); nodes {copy_nodes / 1e6:.2f} MB "
        f"instead of {ours_bytes['gyre_tree_nodes'] / 1e6:.2f}",
        f"{naive_bytes / copy_total:.1f}x fewer",
        f">= {TARGET_FEWER:.0f}x",
        verdict(naive_bytes / copy_total >= TARGET_FEWER),
    )
    table.add_row(
        "  of which the log (payloads, bodies, indexes)",
        f"{ours_bytes['gyre_events'] / 1e6:.2f} MB",
        f"{log_rows} rows: payloads {payload_bytes / 1e6:.2f} MB ({payload_raw / 1e6:.2f} MB raw), "
        f"bodies {body_bytes / 1e6:.2f} MB",
        "",
        "",
        "",
    )
    table.add_row(
        "  of which the tree projection",
        f"{sum(ours_bytes[t] for t in TREE_TABLES) / 1e6:.2f} MB",
        ", ".join(f"{t.removeprefix('gyre_tree_')} {ours_bytes[t] / 1e6:.2f}" for t in TREE_TABLES),
        "",
        "",
        "",
    )
    table.add_row(
        "tokens in the tree projection alone",
        f"{stored:,}",
        f"{full_inputs:,} (every record's full input)",
        f"{full_inputs / stored:.1f}x fewer",
        "(projection only)",
        "",
    )
    table.add_row(
        "tokens the tokenizer returned at ingest",
        f"{first.tokenizer_tokens:,} in {first.tokenizer_calls:,} calls",
        f"{walk.new_input_tokens:,} input tokens new to the tree (separate walk)",
        f"{first.tokenizer_tokens / walk.new_input_tokens:.3f}",
        f"<= {TARGET_TOKENIZED}",
        verdict(first.tokenizer_tokens / walk.new_input_tokens <= TARGET_TOKENIZED),
    )
    table.add_row(
        "  the ingestor's own count (old figure)",
        f"{first.ingestor_count:,} template tokens",
        "specials and cached newlines are not tokenizer output",
        "",
        "",
        "",
    )
    table.add_row(
        "naive path: tokenizer returned",
        f"{first.naive_tokens:,} in {first.naive_calls:,} calls",
        f"{first.tokenizer_tokens:,} (ours)",
        f"{first.naive_tokens / max(first.tokenizer_tokens, 1):.1f}x more",
        "",
        "",
    )
    ratios = [r.naive_s / r.ours_s for r in runs]
    table.add_row(
        f"ingest time (s), {len(runs)} runs",
        spread([r.ours_s for r in runs], ".2f"),
        spread([r.naive_s for r in runs], ".2f") + " naive",
        spread(ratios, ".1f") + "x faster",
        f">= {TARGET_INGEST:.0f}x (median)",
        verdict(statistics.median(ratios) >= TARGET_INGEST),
    )
    rebuild = [n / t for n, t in zip(naive_reads, tree_reads, strict=True)]
    table.add_row(
        "rebuild all record inputs (s)",
        spread(tree_reads, ".3f"),
        spread(naive_reads, ".3f") + " (read naive rows back)",
        spread(rebuild, ".2f") + "x",
        f"> {TARGET_REBUILD:.0f}x (median)",
        verdict(statistics.median(rebuild) > TARGET_REBUILD),
    )
    path_len = np.array([p for p, _ in per_record], dtype=float)
    times = np.array([t for _, t in per_record])
    slope = float(np.polyfit(path_len, times * 1e6, 1)[0]) if len(set(path_len)) > 1 else 0.0
    table.add_row(
        "rebuild one input",
        f"{times.mean() * 1e6:.0f} us mean",
        f"{path_len.mean():.1f} nodes on path (max {int(path_len.max())})",
        f"{slope:.2f} us per node",
        "O(path)",
        "",
    )
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
