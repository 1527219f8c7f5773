"""Reading one execution's trajectory tree: exact inputs, candidates and statistics.

A ``TreeView`` loads the nodes and records of one execution from any ProjectionStore and
answers from memory: a record's input is rebuilt by walking its path (O(path length) in
nodes), candidate trajectories are the leaves with their root-to-leaf paths, and the
statistics are the ones the paper reports for its execution f3ad38e5.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
import numpy as np
import numpy.typing as npt

from gyre_store.catalog import LeafClass
from gyre_store.exceptions import NoTrajectoryTree, ProjectionError
from gyre_store.projections import ProjectionStore, Row


@dataclass(frozen=True, slots=True)
class TreeNode:
    node_id: int
    parent_id: int | None
    root_id: int
    kind: str
    start: int
    tokens: npt.NDArray[np.int32]
    provenance: npt.NDArray[np.uint8]
    logprobs: npt.NDArray[np.float32] | None
    trainable: npt.NDArray[np.bool_] | None
    msg_ends: npt.NDArray[np.int32]
    path_trainable: int
    path_messages: int
    children: int
    request_id: str

    @property
    def end(self) -> int:
        return self.start + int(self.tokens.shape[0])

    @classmethod
    def from_row(cls, row: Row, payload: bytes) -> TreeNode:
        """A node row with its arrays sliced from ``payload``, the stored payload of the record
        event the row refers to (``row["position"]``)."""
        n = int(row["n_tokens"])

        def sliced(at: int | None, dtype: str) -> npt.NDArray[np.generic] | None:
            return None if at is None else payload_slice(row, payload, at, n, dtype)

        def arr(blob: bytes | None, dtype: str) -> npt.NDArray[np.generic]:
            return np.frombuffer(bytes(blob or b""), dtype=dtype)

        return cls(
            node_id=int(row["node_id"]),
            parent_id=None if row["parent_id"] is None else int(row["parent_id"]),
            root_id=int(row["root_id"]),
            kind=str(row["kind"]),
            start=int(row["start"]),
            tokens=sliced(int(row["tokens_at"]), "<i4"),  # type: ignore[arg-type]
            provenance=sliced(int(row["provenance_at"]), "|u1"),  # type: ignore[arg-type]
            logprobs=sliced(row["logprobs_at"], "<f4"),  # type: ignore[arg-type]
            trainable=sliced(row["trainable_at"], "|b1"),  # type: ignore[arg-type]
            msg_ends=arr(row["msg_ends"], "<i4"),  # type: ignore[arg-type]
            path_trainable=int(row["path_trainable"]),
            path_messages=int(row["path_messages"]),
            children=int(row["children"]),
            request_id=str(row["request_id"]),
        )


def payload_slice(row: Row, payload: bytes, at: int, n: int, dtype: str) -> npt.NDArray[np.generic]:
    """``n`` elements of ``dtype`` from byte ``at`` of the payload tree node ``row`` refers to;
    a slice past the payload's end is a ProjectionError naming the node and the event."""
    end = at + np.dtype(dtype).itemsize * n
    if at < 0 or end > len(payload):
        raise ProjectionError(
            f"tree node {row['node_id']} of {row['execution_id']} refers to bytes {at} to "
            f"{end} of event {row['position']}'s payload, which has {len(payload)}"
        )
    return np.frombuffer(payload, dtype=dtype, count=n, offset=at)


def resolve_nodes(store: ProjectionStore, rows: Sequence[Row]) -> list[TreeNode]:
    """Tree node rows as nodes, each with its arrays (ids, provenance, logprobs, trainable mask)
    sliced from the payload of the record event it refers to (one read of those payloads for
    all the rows)."""
    payloads = store.payloads(sorted({int(r["position"]) for r in rows}))
    out = []
    for row in rows:
        payload = payloads.get(int(row["position"]))
        if payload is None:
            raise ProjectionError(
                f"tree node {row['node_id']} of {row['execution_id']} refers to event "
                f"{row['position']}, which has no payload in the log"
            )
        out.append(TreeNode.from_row(row, payload))
    return out


@dataclass(frozen=True, slots=True)
class TreeRecord:
    request_id: str
    seq: int
    end_node: int
    input_len: int
    output_len: int
    agent_kind: str
    agent_id: str
    purpose: str
    leaf_class: LeafClass
    superseded: bool
    finish: str


@dataclass(frozen=True, slots=True)
class Candidate:
    """A candidate trajectory: a leaf and its root-to-leaf path (root first)."""

    leaf: int
    request_id: str
    leaf_class: LeafClass
    path: tuple[int, ...]
    path_tokens: int
    trainable_tokens: int
    path_messages: int


class TreeStats(msgspec.Struct, frozen=True):
    """An execution's tree in the paper's terms (nodes are message nodes)."""

    execution_id: str
    requests: int
    roots: int
    unique_message_nodes: int
    unique_tokens: int
    trainable_tokens: int
    candidates: int
    candidates_by_class: dict[str, int]
    nodes_per_path_min: int
    nodes_per_path_max: int
    node_occurrences_expanded: int
    repetitions_saved: int
    tokens_expanded: int
    tokens_saved: int
    record_input_tokens: int


class TreeView:
    """One execution's tree, in memory."""

    def __init__(self, execution_id: str, nodes: dict[int, TreeNode], records: dict[str, TreeRecord]) -> None:
        self.execution_id = execution_id
        self.nodes = nodes
        self.records = records

    @classmethod
    def load(cls, store: ProjectionStore, execution_id: str) -> TreeView:
        rows = store.select("gyre_tree_nodes", "execution_id", execution_id)
        nodes = {n.node_id: n for n in resolve_nodes(store, rows)}
        if not nodes:
            raise NoTrajectoryTree(f"no trajectory tree for execution {execution_id!r}")
        records = {
            r["request_id"]: TreeRecord(
                request_id=r["request_id"],
                seq=int(r["seq"]),
                end_node=int(r["output_node"]),
                input_len=int(r["input_len"]),
                output_len=int(r["output_len"]),
                agent_kind=r["agent_kind"],
                agent_id=r["agent_id"],
                purpose=r["purpose"],
                leaf_class=LeafClass(r["leaf_class"]),
                superseded=bool(r["superseded"]),
                finish=r["finish"],
            )
            for r in store.select("gyre_tree_records", "execution_id", execution_id)
        }
        return cls(execution_id, nodes, records)

    def path(self, node_id: int) -> list[int]:
        """Node ids from the root down to ``node_id``."""
        out: list[int] = []
        current: int | None = node_id
        while current is not None:
            out.append(current)
            current = self.nodes[current].parent_id
        out.reverse()
        return out

    def sequence(self, node_id: int) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.uint8]]:
        """Tokens and provenance from the root to the end of ``node_id``."""
        path = [self.nodes[n] for n in self.path(node_id)]
        return np.concatenate([n.tokens for n in path]), np.concatenate([n.provenance for n in path])

    def input_of(self, request_id: str) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.uint8]]:
        """The exact input token ids (and provenance) the engine received for a record."""
        rec = self.records[request_id]
        tokens, prov = self.sequence(rec.end_node)
        return tokens[: rec.input_len], prov[: rec.input_len]

    def output_of(self, request_id: str) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.float32]]:
        """A record's output tokens and their behaviour logprobs."""
        rec = self.records[request_id]
        path = [self.nodes[n] for n in self.path(rec.end_node)]
        tokens = np.concatenate([n.tokens for n in path])[rec.input_len :]
        logprobs = np.concatenate(
            [
                n.logprobs if n.logprobs is not None else np.full(n.tokens.shape[0], np.nan, np.float32)
                for n in path
            ]
        )[rec.input_len :]
        return tokens, logprobs

    def candidates(self) -> list[Candidate]:
        # Where records share an end node, the latest decides (as in the stored topology).
        by_end = {r.end_node: r for r in sorted(self.records.values(), key=lambda r: r.seq)}
        out = []
        for node in self.nodes.values():
            rec = by_end.get(node.node_id)
            if node.children or rec is None or rec.superseded:
                continue
            out.append(
                Candidate(
                    leaf=node.node_id,
                    request_id=rec.request_id,
                    leaf_class=rec.leaf_class,
                    path=tuple(self.path(node.node_id)),
                    path_tokens=node.end,
                    trainable_tokens=node.path_trainable,
                    path_messages=node.path_messages,
                )
            )
        return sorted(out, key=lambda c: c.leaf)

    def stats(self) -> TreeStats:
        cands = self.candidates()
        unique_messages = sum(int(n.msg_ends.shape[0]) for n in self.nodes.values())
        unique_tokens = sum(int(n.tokens.shape[0]) for n in self.nodes.values())
        occurrences = sum(c.path_messages for c in cands)
        expanded_tokens = sum(c.path_tokens for c in cands)
        per_path = [c.path_messages for c in cands] or [0]
        return TreeStats(
            execution_id=self.execution_id,
            requests=len(self.records),
            roots=len({n.root_id for n in self.nodes.values()}),
            unique_message_nodes=unique_messages,
            unique_tokens=unique_tokens,
            trainable_tokens=sum(
                int(n.trainable.sum()) for n in self.nodes.values() if n.trainable is not None
            ),
            candidates=len(cands),
            candidates_by_class=dict(sorted(Counter(c.leaf_class.value for c in cands).items())),
            nodes_per_path_min=min(per_path),
            nodes_per_path_max=max(per_path),
            node_occurrences_expanded=occurrences,
            repetitions_saved=occurrences - unique_messages,
            tokens_expanded=expanded_tokens,
            tokens_saved=expanded_tokens - unique_tokens,
            record_input_tokens=sum(r.input_len for r in self.records.values()),
        )
