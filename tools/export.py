"""``gyre export``: a run's data out of the store, as files other tools read.

* ``parquet`` / ``jsonl``: one row per admitted trajectory of every group training consumed
  (``gyre_train.trajectories.export``), read by ``datasets.load_dataset("parquet"|"json")``.
* ``atif``: every candidate trajectory of every execution of the run as one Harbor ATIF v1.4
  document per line; its messages are decoded from the recorded token ids (the store keeps
  tokens, not the harness's JSON), so their text is what the model saw.

The file is written beside ``--out`` and renamed into place when complete.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import tomllib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import msgspec
import numpy as np
from rich.progress import Progress

from gyre_proxy.answer import parse_output
from gyre_proxy.chat import TextBlock, ThinkingBlock, ToolUseBlock
from gyre_proxy.engines import Tokenizer, qwen_tokenizer
from gyre_proxy.ingest.checkpoint import load_tokenizer
from gyre_store import (
    ConfigError,
    PostgresEventLog,
    PostgresProjectionStore,
    Provenance,
    RunConfigured,
    RunStarted,
    StreamId,
    catch_up,
)
from gyre_store.trees import Candidate, TreeRecord, TreeView
from gyre_tools.cli import add_env_argument
from gyre_tools.common import add_store_arguments, all_projections, console, open_store

if TYPE_CHECKING:
    import pyarrow as pa

    from gyre_train.trajectories.buffer import GroupSourceConfig
    from gyre_train.trajectories.export import ExportedRow

FORMATS = ("parquet", "jsonl", "atif")
ATIF_VERSION = "ATIF-v1.4"
_SAMPLED, _TEMPLATE = int(Provenance.SAMPLED), int(Provenance.TEMPLATE)
# Tokens that end a turn in the template families the proxy knows (qwen, llama3): sampled, but
# markup, not the message.
TURN_ENDS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>")


def register(subparsers: Any) -> None:
    ex = subparsers.add_parser("export", help="write a run's admitted trajectories or executions to a file")
    add_store_arguments(ex)
    ex.add_argument("--run", required=True, help="the run id")
    ex.add_argument(
        "--format",
        required=True,
        choices=FORMATS,
        help="parquet or jsonl (admitted trajectories), atif (executions as ATIF trajectories)",
    )
    ex.add_argument("--out", required=True, help="the file to write")
    add_env_argument(
        ex,
        "--model",
        "GYRE_EXPORT_MODEL",
        help="atif: the checkpoint folder whose tokenizer.json decodes the tokens "
        "(unset: the bundled Qwen3.6 vocabulary, as the proxy without --model)",
    )
    ex.set_defaults(func=run)


# -- the run's own settings -----------------------------------------------------------------------


def run_settings(log: PostgresEventLog, run_id: str) -> GroupSourceConfig:
    """The admission and advantage settings and the seed training used, from the run's events.

    ``run.configured`` carries the whole config (``gyre run``); a run without it (recorded by
    hand or by an older gyre) has J_max from ``run.started`` and the defaults otherwise, which
    the check against ``group.consumed`` then confirms or refuses."""
    from gyre_tools.run_config import RunConfig
    from gyre_train import AdmissionConfig, AdvantageConfig, GroupSourceConfig

    configured = started = None
    for recorded in log.read_stream(StreamId("run", run_id)):
        if isinstance(recorded.event, RunConfigured):
            configured = recorded.event
        elif isinstance(recorded.event, RunStarted):
            started = recorded.event
    if configured is not None:
        # Only the keys read here; the whole-config checks of ``parse_config`` look at the machine
        # (task folders, engines), which may have changed since the run.
        try:
            config = msgspec.convert(tomllib.loads(configured.config_toml), RunConfig)
        except (tomllib.TOMLDecodeError, msgspec.ValidationError) as exc:
            raise ConfigError(f"run.configured of {run_id} does not read as a run config: {exc}") from exc
        return GroupSourceConfig(
            admission=AdmissionConfig(max_trajectories=config.train.jmax),
            advantages=AdvantageConfig(scale_by_std=config.train.scale_advantages),
            seed=config.seed,
            run_id=run_id,
        )
    jmax = started.max_trajectories if started is not None else AdmissionConfig().max_trajectories
    return GroupSourceConfig(admission=AdmissionConfig(max_trajectories=jmax), run_id=run_id)


# -- writing -------------------------------------------------------------------------------------------


def check_out(path: Path) -> None:
    """Refuse an output path that cannot be written, before reading anything."""
    if path.is_dir():
        raise ConfigError(f"--out {path} is a folder; name a file")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise ConfigError(f"--out {path}: {parent} is not an existing folder")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ConfigError(f"--out {path} is not writable")


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A scratch path beside ``path`` that becomes ``path`` when the block completes."""
    scratch = path.with_name(f".{path.name}.partial")
    try:
        yield scratch
        os.replace(scratch, path)
    except OSError as exc:
        raise ConfigError(f"--out {path}: {exc.strerror or exc}") from exc
    finally:
        scratch.unlink(missing_ok=True)


def row_record(row: ExportedRow) -> dict[str, Any]:
    """One admitted trajectory as plain values (the JSONL line, the Parquet row)."""
    sampled = row.policy_versions[row.target_mask]
    return {
        "run_id": row.run_id,
        "step": row.step,
        "group_id": row.group_id,
        "group_policy_version": row.group_policy_version,
        "execution_id": row.execution_id,
        "trajectory": row.trajectory,
        "leaf_request_id": row.leaf_request_id,
        "leaf_class": row.leaf_class,
        "advantage": row.advantage,
        "num_tokens": int(row.token_ids.shape[0]),
        "target_count": row.target_count,
        "token_ids": row.token_ids.tolist(),
        "target_mask": row.target_mask.tolist(),
        "behaviour_logprobs": row.behaviour_logprobs.tolist(),
        "provenance": row.provenance.tolist(),
        "policy_versions": row.policy_versions.tolist(),
        "target_policy_versions": sorted({int(v) for v in sampled if v >= 0}),
    }


def parquet_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            ("run_id", pa.string()),
            ("step", pa.int64()),
            ("group_id", pa.string()),
            ("group_policy_version", pa.int64()),
            ("execution_id", pa.string()),
            ("trajectory", pa.int64()),
            ("leaf_request_id", pa.string()),
            ("leaf_class", pa.string()),
            ("advantage", pa.float64()),
            ("num_tokens", pa.int64()),
            ("target_count", pa.int64()),
            ("token_ids", pa.list_(pa.int32())),
            ("target_mask", pa.list_(pa.bool_())),
            ("behaviour_logprobs", pa.list_(pa.float32())),
            ("provenance", pa.list_(pa.uint8())),
            ("policy_versions", pa.list_(pa.int32())),
            ("target_policy_versions", pa.list_(pa.int64())),
        ]
    )


def write_rows(rows_by_group: Iterator[list[ExportedRow]], path: Path, fmt: str) -> int:
    """Write the rows group by group (bounded memory); returns how many."""
    count = 0
    if fmt == "jsonl":
        with path.open("w", encoding="utf-8") as out:
            for rows in rows_by_group:
                for row in rows:
                    out.write(json.dumps(row_record(row)) + "\n")
                    count += 1
        return count
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError("--format parquet needs pyarrow: pip install 'gyre[export]'") from None
    schema = parquet_schema()
    with pq.ParquetWriter(path, schema) as writer:
        for rows in rows_by_group:
            if rows:
                writer.write_table(pa.Table.from_pylist([row_record(r) for r in rows], schema=schema))
                count += len(rows)
        if count == 0:
            writer.write_table(schema.empty_table())
    return count


# -- ATIF ----------------------------------------------------------------------------------------------


def message_spans(view: TreeView, path: Sequence[int]) -> list[tuple[int, int]]:
    """[start, end) path offsets of each message on ``path``: the recorded message ends, and each
    record output on the path as a span of its own."""
    end = view.nodes[path[-1]].end
    on_path = set(path)
    cuts = {0, end}
    for node_id in path:
        cuts.update(int(e) for e in view.nodes[node_id].msg_ends)
    for record in view.records.values():
        if record.end_node in on_path and record.output_len:
            cuts.update((record.input_len, record.input_len + record.output_len))
    ordered = sorted(c for c in cuts if 0 <= c <= end)
    return list(itertools.pairwise(ordered))


def _content(tok: Tokenizer, ids: np.ndarray[Any, Any], prov: np.ndarray[Any, Any]) -> str:
    """The text of a harness-supplied message: its tokens without the template's markup."""
    return tok.decode(ids[prov != _TEMPLATE].tolist()).strip()


def _runs(prov: np.ndarray[Any, Any], code: int) -> list[tuple[int, int]]:
    """Maximal [start, end) runs of ``code`` in ``prov`` (each tool result of a message)."""
    flags = np.concatenate([[False], prov == code, [False]]).astype(np.int8)
    edges = np.flatnonzero(np.diff(flags))
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def agent_fields(tok: Tokenizer, text: str, thinking_open: bool, call_prefix: str) -> dict[str, Any]:
    """message, reasoning_content and tool_calls of an assistant output, parsed as the proxy
    parses what an engine samples (Hermes ``<tool_call>`` JSON; reasoning in ``<think>``)."""
    counter = iter(range(1_000_000))
    parsed = parse_output(
        text, thinking_open=thinking_open, id_factory=lambda: f"{call_prefix}{next(counter)}"
    )
    fields: dict[str, Any] = {
        "message": "\n\n".join(b.text for b in parsed.blocks if isinstance(b, TextBlock))
    }
    reasoning = "\n\n".join(b.thinking for b in parsed.blocks if isinstance(b, ThinkingBlock))
    if reasoning:
        fields["reasoning_content"] = reasoning
    calls = []
    for block in parsed.blocks:
        if isinstance(block, ToolUseBlock):
            try:
                arguments = json.loads(block.input_json or "{}")
            except json.JSONDecodeError:
                arguments = None
            if not isinstance(arguments, dict):
                arguments = {"input": block.input_json}
            calls.append({"tool_call_id": block.id, "function_name": block.name, "arguments": arguments})
    if calls:
        fields["tool_calls"] = calls
    return fields


def atif_document(
    view: TreeView, candidate: Candidate, tok: Tokenizer, *, agent: dict[str, Any], extra: dict[str, Any]
) -> dict[str, Any]:
    """One candidate trajectory (its root-to-leaf path) as an ATIF document.

    Each recorded message becomes a step: system and user messages as ``system``/``user`` steps
    (evaluator critique as a ``user`` step marked in ``extra``), a record's output as an
    ``agent`` step with its token ids and behaviour logprobs in ``metrics``, harness-supplied
    assistant text as an ``agent`` step marked ``injected_assistant``, and tool results as the ``observation``
    of the agent step before them (matched to its tool calls in order: the tokens hold no ids).
    """
    path = list(candidate.path)
    ids, prov = view.sequence(candidate.leaf)
    outputs = {(r.input_len, r.input_len + r.output_len): r for r in view.records.values() if r.output_len}
    ends = {tok.specials[t] for t in TURN_ENDS if t in tok.specials}
    steps: list[dict[str, Any]] = []
    last_agent: dict[str, Any] | None = None
    prompt_total = completion_total = 0
    for start, end in message_spans(view, path):
        seg_ids, seg_prov = ids[start:end], prov[start:end]
        content = seg_prov[seg_prov != _TEMPLATE]
        kind = int(np.bincount(content).argmax()) if content.size else _TEMPLATE
        record: TreeRecord | None = outputs.get((start, end))
        step: dict[str, Any]
        if record is not None or kind in (_SAMPLED, Provenance.INJECTED_ASSISTANT):
            body = seg_ids
            if record is None:  # an assistant message in a later context: drop the role header
                inside = np.flatnonzero(seg_prov != _TEMPLATE)
                body = seg_ids[int(inside[0]) : int(inside[-1]) + 1]
            while body.size and int(body[-1]) in ends:
                body = body[:-1]
            before = tok.decode(ids[max(0, start - 4) : start].tolist())
            step = {"source": "agent"} | agent_fields(
                tok,
                tok.decode(body.tolist()),
                thinking_open=before.rstrip().endswith("<think>"),
                call_prefix=f"{record.request_id if record else start}-call-",
            )
            if record is not None:
                _, logprobs = view.output_of(record.request_id)
                step["metrics"] = {
                    "prompt_tokens": record.input_len,
                    "completion_tokens": record.output_len,
                    "completion_token_ids": seg_ids.tolist(),
                }
                if bool((seg_prov == _SAMPLED).all()) and bool(np.isfinite(logprobs).all()):
                    step["metrics"]["logprobs"] = logprobs.tolist()  # behaviour logprobs, per token
                step["extra"] = {"request_id": record.request_id, "finish": record.finish}
                prompt_total += record.input_len
                completion_total += record.output_len
            elif kind == Provenance.INJECTED_ASSISTANT:
                step["extra"] = {"injected_assistant": True}
            last_agent = step
        elif not content.size:
            continue  # template markup only (a generation prompt)
        else:
            if kind == Provenance.TOOL_RESULT and last_agent is not None:
                calls = last_agent.get("tool_calls", [])
                results = last_agent.setdefault("observation", {"results": []})["results"]
                for a, b in _runs(seg_prov, kind):
                    result: dict[str, Any] = {"content": tok.decode(seg_ids[a:b].tolist()).strip()}
                    if len(results) < len(calls):
                        result["source_call_id"] = calls[len(results)]["tool_call_id"]
                    results.append(result)
                continue
            source = "system" if kind == Provenance.SYSTEM else "user"
            step = {"source": source, "message": _content(tok, seg_ids, seg_prov)}
            if kind not in (Provenance.USER, Provenance.SYSTEM):  # critique, or an unanswered tool result
                step["extra"] = {"provenance": Provenance(kind).name.lower()}
        steps.append(step)
    return {
        "schema_version": ATIF_VERSION,
        "session_id": f"{view.execution_id}/{candidate.request_id}",
        "agent": agent,
        "steps": [{"step_id": number, **step} for number, step in enumerate(steps, start=1)],
        "final_metrics": {
            "total_prompt_tokens": prompt_total,
            "total_completion_tokens": completion_total,
            "total_steps": len(steps),
        },
        "extra": extra,
    }


def write_atif(
    log: PostgresEventLog, store: PostgresProjectionStore, run_id: str, tok: Tokenizer, out: IO[str]
) -> int:
    """Every candidate trajectory of every execution of the run, one ATIF document per line."""
    started = next(
        (r.event for r in log.read_stream(StreamId("run", run_id)) if isinstance(r.event, RunStarted)), None
    )
    executions = sorted({str(r["execution_id"]) for r in store.select("gyre_tree_records", "run_id", run_id)})
    groups = {
        str(r["execution_id"]): str(r["group_id"])
        for eid in executions
        for r in store.select("gyre_group_members", "execution_id", eid)
    }
    count = 0
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("executions", total=len(executions))
        for execution_id in executions:
            view = TreeView.load(store, execution_id)
            agent = {"name": started.harness if started is not None else "unknown", "version": "unknown"}
            if started is not None:
                agent["model_name"] = started.model
            for candidate in sorted(view.candidates(), key=lambda c: view.records[c.request_id].seq):
                extra = {
                    "run_id": run_id,
                    "execution_id": execution_id,
                    "group_id": groups.get(execution_id),
                    "leaf_request_id": candidate.request_id,
                    "leaf_class": candidate.leaf_class.value,
                }
                document = atif_document(view, candidate, tok, agent=agent, extra=extra)
                out.write(msgspec.json.encode(document).decode() + "\n")
                count += 1
            progress.advance(task)
    return count


# -- the command ---------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    from gyre_train.trajectories.export import (
        UnknownRunError,
        consumed_groups,
        exported_rows,
        run_exists,
    )

    out = Path(args.out)
    check_out(out)
    tok: Tokenizer | None = None
    if args.format == "atif":
        tok = load_tokenizer(Path(args.model)) if args.model else qwen_tokenizer()
    with open_store(args) as opened:
        log = opened.log
        if not run_exists(log, args.run):
            raise UnknownRunError(f"{args.run!r}; list runs with: gyre events tail --type run.started")
        projections = all_projections()
        store = PostgresProjectionStore(log.pool, projections.tables())
        if tok is not None:
            head = log.head()
            for name in ("trees", "evaluations", "groups"):
                catch_up(log, store, projections.get(name), until=head)
            with replacing(out) as scratch, scratch.open("w", encoding="utf-8") as handle:
                count = write_atif(log, store, args.run, tok, handle)
            console.print(f"{count} ATIF trajectories of run {args.run} written to {out}")
            return 0
        config = run_settings(log, args.run)
        groups = consumed_groups(log, args.run)
        with Progress(console=console, transient=True) as progress, replacing(out) as scratch:
            task = progress.add_task("groups", total=len(groups))

            def by_group() -> Iterator[list[ExportedRow]]:
                for group in groups:
                    yield list(exported_rows(log, store, args.run, config, [group]))
                    progress.advance(task)

            count = write_rows(by_group(), scratch, args.format)
    console.print(
        f"{count} admitted trajectories of {len(groups)} consumed groups of run {args.run} written to {out} "
        f"(J_max {config.admission.max_trajectories}, seed {config.seed})"
    )
    return 0
