"""A tree's topology and trainable counts, without its tokens: what admission reads.

The tree projection keeps, beside the nodes, one ``topology`` blob per execution in
``gyre_tree_state``: per node id its parent, path offset and trainable-token count, the
latest record ending at it, and per record its leaf class and whether a retry superseded
it. It is folded from the same events as the nodes, so a rebuild by replay reproduces it.
Admission reads this one row; tokens are loaded afterwards for the admitted paths only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gyre_store.catalog import LeafClass
from gyre_store.exceptions import NoTrajectoryTree, ProjectionError
from gyre_store.log import Payload
from gyre_store.projections import ProjectionStore

# A leaf class is stored as its index here; append new classes, never reorder.
LEAF_CODES: tuple[LeafClass, ...] = tuple(LeafClass)
_NODE_ARRAYS = {"parent": "<i4", "start": "<i8", "trainable": "<i4", "leaf_record": "<i4"}
_RECORD_ARRAYS = {"record_class": "|u1", "superseded": "|b1"}


class TopologyBuilder:
    """The mutable form the projection updates while it applies one record."""

    def __init__(self, blob: bytes | None) -> None:
        arrays = Payload.decode(blob) if blob else Payload()
        self.columns: dict[str, list[int]] = {
            name: (np.asarray(arrays[name]).tolist() if name in arrays else [])
            for name in (*_NODE_ARRAYS, *_RECORD_ARRAYS)
        }

    def add_node(self, node_id: int, parent: int | None, start: int, trainable: int) -> None:
        if node_id != len(self.columns["parent"]):
            raise ProjectionError(f"topology expects node {len(self.columns['parent'])}, got {node_id}")
        for name, value in zip(
            _NODE_ARRAYS, (-1 if parent is None else parent, start, trainable, -1), strict=True
        ):
            self.columns[name].append(value)

    def split(self, upper: int, lower: int, offset: int, upper_trainable: int) -> None:
        """``upper`` (new) takes the first part of ``lower``, which now starts at ``offset``."""
        cols = self.columns
        self.add_node(upper, None, cols["start"][lower], upper_trainable)
        cols["parent"][upper] = cols["parent"][lower]
        cols["parent"][lower] = upper
        cols["start"][lower] = offset
        cols["trainable"][lower] -= upper_trainable

    def add_record(self, seq: int, end_node: int, leaf_class: LeafClass) -> None:
        if seq != len(self.columns["record_class"]):
            raise ProjectionError(f"topology expects record {len(self.columns['record_class'])}, got {seq}")
        self.columns["record_class"].append(LEAF_CODES.index(leaf_class))
        self.columns["superseded"].append(False)
        self.columns["leaf_record"][end_node] = seq  # the latest record ending at a node decides

    def supersede(self, seq: int) -> None:
        self.columns["superseded"][seq] = True

    def encode(self) -> bytes:
        dtypes = {**_NODE_ARRAYS, **_RECORD_ARRAYS}
        return Payload({name: np.array(v, dtype=dtypes[name]) for name, v in self.columns.items()}).encode()


@dataclass(frozen=True, slots=True, eq=False)
class TreeTopology:
    """One execution's tree without tokens, indexed by stored node id.

    ``leaves`` are the candidate trajectories, ``(node id, class)`` sorted by node id: nodes
    without children where a record ends whose latest record was not superseded by a retry.
    """

    execution_id: str
    parents: npt.NDArray[np.int32]  # [n] parent node id, -1 = root
    starts: npt.NDArray[np.int64]  # [n] path offset of the node's first token
    trainable: npt.NDArray[np.int32]  # [n] trainable tokens among the node's own tokens
    leaves: tuple[tuple[int, LeafClass], ...]

    @classmethod
    def from_blob(cls, execution_id: str, blob: bytes) -> TreeTopology:
        arrays = Payload.decode(blob)
        parents = np.asarray(arrays["parent"])
        leaf_record = np.asarray(arrays["leaf_record"])
        superseded = np.asarray(arrays["superseded"])
        classes = np.asarray(arrays["record_class"])
        has_child = np.zeros(parents.shape[0], dtype=np.bool_)
        has_child[parents[parents >= 0]] = True
        ends = np.flatnonzero(~has_child & (leaf_record >= 0))
        live = ends[~superseded[leaf_record[ends]]]
        leaves = tuple((int(n), LEAF_CODES[int(classes[leaf_record[n]])]) for n in live)
        return cls(
            execution_id, parents, np.asarray(arrays["start"]), np.asarray(arrays["trainable"]), leaves
        )

    @classmethod
    def load(cls, store: ProjectionStore, execution_id: str) -> TreeTopology:
        """Read one row of ``gyre_tree_state``; raise NoTrajectoryTree when the execution has none."""
        rows = store.select("gyre_tree_state", "execution_id", execution_id)
        if not rows:
            raise NoTrajectoryTree(f"no trajectory tree for execution {execution_id!r}")
        return cls.from_blob(execution_id, bytes(rows[0]["topology"]))

    @property
    def num_nodes(self) -> int:
        return int(self.parents.shape[0])
