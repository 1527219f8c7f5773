"""A run's admitted trajectories as flat records, for training elsewhere (``gyre export``).

For every group a training step consumed (``group.consumed``), the group is built again by the
trainer's own code (``StoreGroupSource.build``: advantages from the recorded outcomes, admission
with the run's seed) and each row gets what a row alone lacks: the provenance and the policy
version of every token, its leaf and the step. Nothing is appended to the log. Not here: the file
formats (``gyre_tools.export``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gyre_store import (
    EvaluationsProjection,
    EventLog,
    GroupConsumed,
    GroupsProjection,
    ModelCallRecorded,
    ProjectionStore,
    StreamId,
    catch_up,
    iterate,
)
from gyre_store.trees import TreeProjection, TreeView
from gyre_train.exceptions import GyreTrainError
from gyre_train.trajectories.admission import admission_rng, admit
from gyre_train.trajectories.buffer import GroupSourceConfig, StoreGroupSource
from gyre_train.trajectories.stored import stored_execution

UNKNOWN_VERSION = -1  # a token no engine sampled, or sampled under a version the engine did not name


class ExportError(GyreTrainError):
    """The run's admitted trajectories cannot be exported."""


class UnknownRunError(ExportError):
    """No such run in the store (no run.started, run.configured or group of that id)."""


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
