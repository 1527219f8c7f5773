"""``gyre export``: a run's data out of the store, as files other tools read.

* ``parquet`` / ``jsonl``: one row per admitted trajectory of every group a training step
  consumed, rebuilt by the trainer's own code (``StoreGroupSource.build``) with the run's
  recorded settings and checked against ``group.consumed``; each row also gets the provenance
  and policy version of every token. ``datasets.load_dataset("parquet"|"json")`` reads them.
* ``atif``: executions as Harbor ATIF trajectories (``gyre_tools.export_atif``).

Nothing is appended to the log. The file is written beside ``--out`` and renamed into place
when complete.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np
import numpy.typing as npt
from rich.progress import Progress

from gyre_proxy.engines import CheckpointTokenizer, Tokenizer, qwen_tokenizer
from gyre_store import (
    ConfigError,
    EvaluationsProjection,
    EventLog,
    GroupConsumed,
    GroupsProjection,
    ModelCallRecorded,
    PostgresEventLog,
    PostgresProjectionStore,
    ProjectionStore,
    RunConfigured,
    RunStarted,
    StreamId,
    catch_up,
    iterate,
)
from gyre_store.trees import TreeProjection, TreeView
from gyre_tools.cli import add_env_argument
from gyre_tools.common import add_store_arguments, all_projections, console, open_store
from gyre_tools.export_atif import write_atif
from gyre_tools.run_config import RunConfig

if TYPE_CHECKING:
    import pyarrow as pa

    from gyre_train import GroupSourceConfig

FORMATS = ("parquet", "jsonl", "atif")


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


# -- the admitted trajectories ------------------------------------------------------------------

UNKNOWN_VERSION = -1  # a token no engine sampled, or sampled under a version the engine did not name


class ExportError(ConfigError):
    """The run cannot be exported as asked."""

    def __init__(self, detail: str = "") -> None:
        doc = (type(self).__doc__ or "").strip().rstrip(".")
        super().__init__(f"{doc}: {detail}" if detail else doc)


class UnknownRunError(ExportError):
    """No such run in the store (no run.started, run.configured or consumed group names it)."""


class AdmissionMismatchError(ExportError):
    """Admission replayed with the run's recorded settings does not give what training recorded."""


@dataclass(frozen=True, slots=True)
class ConsumedGroup:
    """One ``group.consumed`` fact: step ``step`` trained on ``group_id``."""

    group_id: str
    step: int
    trajectories: int
    target_tokens: int


@dataclass(frozen=True, slots=True, eq=False)
class ExportedRow:
    """One admitted trajectory as training saw it, with its provenance.

    Arrays are per token of the row (the root-to-leaf path up to the row's last target):
    ``target_mask`` marks the loss targets, ``behaviour_logprobs`` is 0 at non-targets (as in
    ``TokenRow``), ``provenance`` holds ``gyre_store.Provenance`` codes and ``policy_versions``
    the weight version each sampled token came from (``UNKNOWN_VERSION`` elsewhere).
    """

    run_id: str
    step: int
    group_id: str
    group_policy_version: int  # the version the group was dispatched under
    execution_id: str
    trajectory: int  # draw index within the execution
    leaf_request_id: str  # the model call that ends the trajectory
    leaf_class: str
    advantage: float
    token_ids: npt.NDArray[np.int32]
    target_mask: npt.NDArray[np.bool_]
    behaviour_logprobs: npt.NDArray[np.float32]
    provenance: npt.NDArray[np.uint8]
    policy_versions: npt.NDArray[np.int32]

    @property
    def target_count(self) -> int:
        return int(self.target_mask.sum())


def run_exists(log: EventLog, run_id: str) -> bool:
    """Whether the log names ``run_id`` (its run stream, or any consumed group of it)."""
    if log.read_stream(StreamId("run", run_id)):
        return True
    return bool(consumed_groups(log, run_id))


def consumed_groups(log: EventLog, run_id: str) -> list[ConsumedGroup]:
    """The run's consumed groups in the order training took them."""
    return [
        ConsumedGroup(r.event.group_id, r.event.step, r.event.trajectories, r.event.target_tokens)
        for r in iterate(log, types=["group.consumed"])
        if isinstance(r.event, GroupConsumed) and r.event.run_id == run_id
    ]


Spans = dict[str, tuple[tuple[int, int], ...]]  # request id -> (first output token, version)


def weight_spans(log: EventLog, execution_id: str) -> Spans:
    """Each record's weight-version spans: they are in the record's event, not in the tree."""
    return {
        r.event.request_id: r.event.weight_versions
        for r in log.read_stream(StreamId("calls", execution_id))
        if isinstance(r.event, ModelCallRecorded)
    }


def token_versions(view: TreeView, spans: Spans, path: list[int], length: int) -> npt.NDArray[np.int32]:
    """The policy version of every token on ``path`` (node ids, root first), cut to ``length``.

    Output tokens take their version from their record's spans (an output that crossed a
    publication has several); every other token is ``UNKNOWN_VERSION``.
    """
    parts = []
    for node_id in path:
        node = view.nodes[node_id]
        out = np.full(node.tokens.shape[0], UNKNOWN_VERSION, dtype=np.int32)  # [n_node]
        record = view.records.get(node.request_id)
        if node.kind == "output" and record is not None:
            offsets = np.arange(node.start, node.end) - record.input_len  # output offsets
            for first, version in spans.get(node.request_id, ()):
                out[offsets >= first] = version  # spans are in order: later ones overwrite
        parts.append(out)
    return np.concatenate(parts)[:length] if parts else np.zeros(0, np.int32)


def exported_rows(
    log: EventLog,
    store: ProjectionStore,
    run_id: str,
    config: GroupSourceConfig,
    groups: list[ConsumedGroup] | None = None,
) -> Iterator[ExportedRow]:
    """Every admitted trajectory of the run's consumed groups, group by group, in draw order.

    ``config`` must be the run's own (its J_max, advantage scaling and seed) for the rows to be
    the ones training used; each group's trajectory and target counts are checked against its
    ``group.consumed`` record and a difference raises ``AdmissionMismatchError``. Raises
    ``UnknownRunError`` for a run the log does not name.
    """
    # gyre_train (and torch behind it) is imported only when an export runs, as in gyre ablate.
    from gyre_train import StoreGroupSource, admission_rng, admit, stored_execution

    if groups is None:
        if not run_exists(log, run_id):
            raise UnknownRunError(repr(run_id))
        groups = consumed_groups(log, run_id)
    head = log.head()
    for projection in (TreeProjection(), EvaluationsProjection(), GroupsProjection()):
        catch_up(log, store, projection, until=head)
    source = StoreGroupSource(log, store, config, refresh=False)
    for consumed in groups:
        ready = source.build(consumed.group_id)
        rows = sum(len(e.rows) for e in ready.executions)
        targets = sum(r.target_count for e in ready.executions for r in e.rows)
        if (rows, targets) != (consumed.trajectories, consumed.target_tokens):
            raise AdmissionMismatchError(
                f"group {consumed.group_id} gives {rows} trajectories and {targets} targets, step "
                f"{consumed.step} recorded {consumed.trajectories} and {consumed.target_tokens}"
            )
        for execution in ready.executions:
            if not execution.rows:
                continue
            # The rows carry no path; admission is replayed with the same seed to find each one's.
            view = TreeView.load(store, execution.execution_id)
            stored = stored_execution(view)
            admission = admit(
                stored.tree, config.admission, admission_rng(config.seed, execution.execution_id)
            )
            by_draw = {t.draw: t for t in admission.trajectories}
            leaves = {c.leaf: c for c in view.candidates()}
            spans = weight_spans(log, execution.execution_id)
            for row in execution.rows:
                drawn = by_draw[row.trajectory]
                path = [stored.node_ids[i] for i in stored.tree.paths[drawn.leaf_index].tolist()]
                provenance = np.concatenate([view.nodes[n].provenance for n in path])[: len(row)]
                leaf = leaves[path[-1]]
                yield ExportedRow(
                    run_id=run_id,
                    step=consumed.step,
                    group_id=ready.group_id,
                    group_policy_version=ready.policy_version,
                    execution_id=execution.execution_id,
                    trajectory=row.trajectory,
                    leaf_request_id=leaf.request_id,
                    leaf_class=leaf.leaf_class.value,
                    advantage=execution.advantage,
                    token_ids=row.token_ids,
                    target_mask=row.target_mask,
                    behaviour_logprobs=row.behaviour_logprobs,
                    provenance=provenance,
                    policy_versions=token_versions(view, spans, path, len(row)),
                )


def tokenizer(model_dir: Path | None) -> Tokenizer:
    """The tokenizer that decodes ATIF messages: the checkpoint's, or the bundled Qwen3.6 one."""
    if model_dir is None:
        return qwen_tokenizer()
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        raise ConfigError(f"--model {model_dir} has no tokenizer.json (write it with save_pretrained)")
    return CheckpointTokenizer(path, name=model_dir.name)


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


# -- the command ---------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    check_out(out)
    tok: Tokenizer | None = None
    if args.format == "atif":
        tok = tokenizer(Path(args.model) if args.model else None)
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
