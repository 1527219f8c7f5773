"""Trajectory trees: TITO records organized by shared prefix (the projection), recorded
incrementally (the recorder), read back as a tree of nodes and candidate leaves (the view)
and drawn. Only unique tokens are stored; any record's input is rebuilt by walking its path.
"""

from __future__ import annotations

from gyre_store.trees.projection import TreeProjection
from gyre_store.trees.recorder import ExecutionContext, PrefixPoint, TrajectoryRecorder
from gyre_store.trees.render import CLASS_COLOURS, draw, outline
from gyre_store.trees.topology import TreeTopology
from gyre_store.trees.view import Candidate, TreeNode, TreeRecord, TreeStats, TreeView, resolve_nodes

__all__ = [
    "CLASS_COLOURS",
    "Candidate",
    "ExecutionContext",
    "PrefixPoint",
    "TrajectoryRecorder",
    "TreeNode",
    "TreeProjection",
    "TreeRecord",
    "TreeStats",
    "TreeTopology",
    "TreeView",
    "draw",
    "outline",
    "resolve_nodes",
]
