"""The trajectory-tree projection: each execution's records as a radix tree of tokens.

A record names the earlier record its context extends and how many tokens it shares
(``prefix_of``, ``prefix_len``). The projection walks up from that record's end node to
the shared offset, splits the node there if the offset falls inside it (the lower half
keeps its id, so every stored reference to a node end stays valid), and hangs the new
input tokens and then the output tokens below. Unique tokens are stored once: a node keeps
no arrays of its own but the position of the record event whose payload holds them and the
byte offset of its slice of each array there (``tokens_at``, ``provenance_at``, and for an
output ``logprobs_at`` and ``trainable_at``); readers take the slices from the log
(``gyre_store.trees.view.resolve_nodes``, ``gyre_record_input_v1``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import numpy as np
import sqlalchemy as sa

from gyre_store import schema
from gyre_store.catalog import AgentKind, ModelCallRecorded, TitoArrays, leaf_class
from gyre_store.exceptions import ProjectionError
from gyre_store.log import RecordedEvent
from gyre_store.projections import Projection, Row, RowStore
from gyre_store.trees.topology import TopologyBuilder
from gyre_store.trees.view import payload_slice

NODES, RECORDS, STATE = "gyre_tree_nodes", "gyre_tree_records", "gyre_tree_state"


def _count_ends(msg_ends: bytes, upto: int | None = None) -> int:
    ends = np.frombuffer(msg_ends, dtype="<i4")
    return int(ends.shape[0]) if upto is None else int(np.count_nonzero(ends <= upto))


def _trainable_above(rows: RowStore, node: Row, cut: int) -> int:
    """How many of a node's first ``cut`` tokens are trainable, read from its record's payload."""
    if node["trainable_at"] is None:
        return 0
    position = int(node["position"])
    payload = rows.payloads([position]).get(position)
    if payload is None:
        raise ProjectionError(
            f"tree node {node['node_id']} of {node['execution_id']} refers to event {position}, "
            "which has no payload in the log"
        )
    return int(np.count_nonzero(payload_slice(node, payload, int(node["trainable_at"]), cut, "|b1")))


class TreeProjection(Projection):
    """Maintains ``gyre_tree_nodes``, ``gyre_tree_records`` and ``gyre_tree_state``."""

    name: ClassVar[str] = "trees"
    tables: ClassVar[tuple[sa.Table, ...]] = (schema.tree_nodes, schema.tree_records, schema.tree_state)
    event_types: ClassVar[frozenset[str]] = frozenset({"model_call.recorded"})

    def apply(self, rows: RowStore, event: RecordedEvent) -> None:
        self.fold(rows, (event,))

    def fold(self, rows: RowStore, events: Iterable[RecordedEvent]) -> None:
        """Apply ``events`` in order, leaving the rows ``apply`` would leave applied to each in turn.

        Each execution's ``topology`` blob is decoded once, before its first record here, and
        encoded once, after the last: folding a tree's n records is O(n) in the topology, where
        ``apply`` record by record decodes and re-encodes the whole blob each time (O(n^2)).
        """
        topologies: dict[str, TopologyBuilder] = {}
        for event in events:
            self._apply_record(rows, event, topologies)
        for ex, topology in topologies.items():
            state = rows.get(STATE, ex)
            assert state is not None  # written by the record that decoded the topology
            rows.put(STATE, {**state, "topology": topology.encode()})

    def _apply_record(
        self, rows: RowStore, event: RecordedEvent, topologies: dict[str, TopologyBuilder]
    ) -> None:
        """One record into the rows and into its execution's topology in ``topologies`` (the
        caller encodes that into the state row: until then the row's blob is stale)."""
        ev = event.event
        assert isinstance(ev, ModelCallRecorded)
        ex = ev.execution_id
        if rows.get(RECORDS, ex, ev.request_id) is not None:
            return  # a record is applied once, however often it is delivered
        arrays = TitoArrays.from_payload(event.payload)
        state = rows.get(STATE, ex) or {
            "execution_id": ex, "next_node": 0, "records": 0, "first_root": None, "topology": b"",
        }  # fmt: skip
        topology = topologies.get(ex)
        if topology is None:
            topology = topologies[ex] = TopologyBuilder(state["topology"])

        parent: Row | None = None
        if ev.prefix_of is not None and ev.prefix_len > 0:
            prior = rows.get(RECORDS, ex, ev.prefix_of)
            if prior is None:
                raise ProjectionError(f"record {ev.request_id} extends unknown record {ev.prefix_of} in {ex}")
            full = int(prior["input_len"]) + int(prior["output_len"])
            if ev.prefix_len > full:
                raise ProjectionError(
                    f"record {ev.request_id} shares {ev.prefix_len} tokens with {ev.prefix_of}, which has {full}"
                )
            parent = self._point(rows, state, topology, ex, int(prior["output_node"]), ev.prefix_len)

        end = parent
        assert event.payload is not None  # from_payload refuses a record without one
        at = event.payload.layout()  # where each array starts in the stored payload
        if arrays.input_len:
            end = self._add_node(
                rows, state, topology, ex, end, "input", ev.request_id, arrays.input_len, 0,
                position=event.position, tokens_at=at["input_ids"], provenance_at=at["input_prov"],
                logprobs_at=None, trainable_at=None, msg_ends=arrays.msg_ends.tobytes(),
            )  # fmt: skip
        if arrays.output_len:
            out_end = np.array([ev.prefix_len + arrays.input_len + arrays.output_len], dtype="<i4")
            end = self._add_node(
                rows, state, topology, ex, end, "output", ev.request_id, arrays.output_len,
                int(np.count_nonzero(arrays.output_trainable)),
                position=event.position, tokens_at=at["output_ids"], provenance_at=at["output_prov"],
                logprobs_at=at["output_logprobs"], trainable_at=at["output_trainable"],
                msg_ends=out_end.tobytes() if arrays.output_hash.shape[0] else b"",
            )  # fmt: skip
        if end is None:
            raise ProjectionError(f"record {ev.request_id} of {ex} has no tokens")

        kind = ev.agent_kind
        if kind == AgentKind.UNKNOWN:
            # Without a harness plug-in: the first context root is the main agent's. A root
            # keeps its ``root_id`` label even when a split puts a new node above it.
            kind = AgentKind.MAIN if end["root_id"] == state["first_root"] else AgentKind.SUB_AGENT
        if ev.retry_of is not None:
            replaced = rows.get(RECORDS, ex, ev.retry_of)
            if replaced is not None:
                rows.put(RECORDS, {**replaced, "superseded": True})
                topology.supersede(int(replaced["seq"]))
        versions = ev.weight_versions
        rows.put(
            RECORDS,
            {
                "execution_id": ex,
                "request_id": ev.request_id,
                "run_id": ev.run_id,
                "seq": state["records"],
                "position": event.position,
                "output_node": end["node_id"],
                "input_len": ev.prefix_len + arrays.input_len,
                "output_len": arrays.output_len,
                "new_input_len": arrays.input_len,
                "prefix_of": ev.prefix_of,
                "prefix_len": ev.prefix_len,
                "retry_of": ev.retry_of,
                "superseded": False,
                "agent_kind": kind.value,
                "agent_id": ev.agent_id,
                "purpose": ev.purpose.value,
                "leaf_class": leaf_class(kind, ev.purpose).value,
                "finish": ev.finish.value,
                "engine": ev.engine,
                "policy_version": versions[0][1] if versions else event.metadata.policy_version,
            },
        )
        topology.add_record(state["records"], int(end["node_id"]), leaf_class(kind, ev.purpose))
        state["records"] += 1
        rows.put(STATE, state)

    # -- radix operations -------------------------------------------------------------------
    def _point(
        self, rows: RowStore, state: Row, topology: TopologyBuilder, ex: str, node_id: int, offset: int
    ) -> Row:
        """The node that ends exactly at path ``offset`` on the path to ``node_id`` (splitting one)."""
        node = self._node(rows, ex, node_id)
        while int(node["start"]) >= offset:
            node = self._node(rows, ex, int(node["parent_id"]))
        end = int(node["start"]) + int(node["n_tokens"])
        if end == offset:
            return node
        return self._split(rows, state, topology, ex, node, offset)

    def _split(
        self, rows: RowStore, state: Row, topology: TopologyBuilder, ex: str, node: Row, offset: int
    ) -> Row:
        cut = offset - int(node["start"])
        parent = self._node(rows, ex, int(node["parent_id"])) if node["parent_id"] is not None else None
        ends = np.frombuffer(node["msg_ends"], dtype="<i4")
        upper_ends, lower_ends = ends[ends <= offset], ends[ends > offset]

        def moved(at: int | None, width: int) -> int | None:
            return None if at is None else at + cut * width

        upper_trainable = _trainable_above(rows, node, cut)
        upper: Row = {
            **node,
            "node_id": state["next_node"],
            "n_tokens": cut,
            "msg_ends": upper_ends.tobytes(),
            "path_trainable": (int(parent["path_trainable"]) if parent else 0) + upper_trainable,
            "path_messages": (int(parent["path_messages"]) if parent else 0) + int(upper_ends.shape[0]),
            "children": 1,
            "request_id": node["request_id"],
        }
        state["next_node"] += 1
        lower: Row = {
            **node,
            "parent_id": upper["node_id"],
            "start": offset,
            "n_tokens": int(node["n_tokens"]) - cut,
            "tokens_at": moved(node["tokens_at"], 4),
            "provenance_at": moved(node["provenance_at"], 1),
            "logprobs_at": moved(node["logprobs_at"], 4),
            "trainable_at": moved(node["trainable_at"], 1),
            "msg_ends": lower_ends.tobytes(),
        }
        rows.put(NODES, upper)
        rows.put(NODES, lower)
        topology.split(int(upper["node_id"]), int(node["node_id"]), offset, upper_trainable)
        return upper

    def _add_node(
        self,
        rows: RowStore,
        state: Row,
        topology: TopologyBuilder,
        ex: str,
        parent: Row | None,
        kind: str,
        by: str,
        n: int,
        trainable: int,
        **arrays: Any,
    ) -> Row:
        node_id = state["next_node"]
        state["next_node"] += 1
        if parent is None and state["first_root"] is None:
            state["first_root"] = node_id
        node: Row = {
            "execution_id": ex,
            "node_id": node_id,
            "parent_id": None if parent is None else parent["node_id"],
            "root_id": node_id if parent is None else parent["root_id"],
            "kind": kind,
            "start": 0 if parent is None else int(parent["start"]) + int(parent["n_tokens"]),
            "n_tokens": n,
            **arrays,
            "path_trainable": (int(parent["path_trainable"]) if parent else 0) + trainable,
            "path_messages": (int(parent["path_messages"]) if parent else 0)
            + _count_ends(arrays["msg_ends"]),
            "children": 0,
            "request_id": by,
        }
        if parent is not None:
            parent = {**parent, "children": int(parent["children"]) + 1}
            rows.put(NODES, parent)
        rows.put(NODES, node)
        topology.add_node(node_id, node["parent_id"], int(node["start"]), trainable)
        return node

    @staticmethod
    def _node(rows: RowStore, ex: str, node_id: int) -> Row:
        node = rows.get(NODES, ex, node_id)
        if node is None:
            raise ProjectionError(f"tree of {ex} has no node {node_id}")
        return node
