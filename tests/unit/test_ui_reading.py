"""The web view's reading of the log as of a position, and its drawing of a tree, in memory."""

from __future__ import annotations

import re

import pytest

from gyre_store import ConfigError, InMemoryEventLog, StreamId
from gyre_tools.ui import svg
from gyre_tools.ui.reading import ReadOnlyLog, at_position, reward_of, runs, tree_at
from tests.unit.train.runs import dispatch_group, memory_store, record_trace


def _log() -> InMemoryEventLog:
    log = InMemoryEventLog()
    dispatch_group(log, "r", "g0", ["e0"])
    record_trace(log, "e0", "r", seed=4)
    return log


def test_a_position_cuts_every_read() -> None:
    log = _log()
    cut = at_position(log, 3)
    assert cut.head() == 3 and not cut.live
    assert [r.position for r in cut.read(0, limit=100)] == [1, 2, 3]
    assert cut.read(0, until=10**9) == cut.read(0)  # an explicit ``until`` never reads past it
    assert cut.read(3) == []
    calls = log.read_stream(StreamId("calls", "e0"))
    assert len(calls) > 1
    assert [r.position for r in cut.read_stream(StreamId("calls", "e0"))] == [
        p for p in (r.position for r in calls) if p <= 3
    ]
    assert at_position(log, 10**9).head() == log.head()  # past the head: the head
    assert at_position(log, None).live and at_position(log, None).head() == log.head()
    with pytest.raises(ConfigError, match="0 or more"):
        at_position(log, -1)
    with pytest.raises(ReadOnlyLog):
        cut.append([])


def test_a_tree_at_a_position_has_the_records_up_to_there() -> None:
    log = _log()
    calls = [r.position for r in log.read_stream(StreamId("calls", "e0"))]
    whole = tree_at(at_position(log, None), "e0")
    half = tree_at(at_position(log, calls[len(calls) // 2]), "e0")
    assert whole is not None and half is not None
    assert len(whole.records) == len(calls) and len(half.records) == len(calls) // 2 + 1
    assert tree_at(at_position(log, calls[0] - 1), "e0") is None
    # Folded at the head it is the projection's tree.
    store = memory_store(log)
    assert set(tree_at(at_position(log, None), "e0", store).nodes) == set(whole.nodes)  # type: ignore[union-attr]


def test_no_reward_before_an_evaluation_and_no_run_without_run_started() -> None:
    log = _log()
    assert reward_of(at_position(log, None), "e0").kind == "pending"
    assert runs(at_position(log, None)) == []


def test_the_tree_drawing_has_one_linked_box_per_node_and_a_lane_per_branch() -> None:
    view = tree_at(at_position(_log(), None), "e0")
    assert view is not None
    drawing = svg.tree(view, lambda n: f"/n/{n}", {})
    assert sorted(map(int, re.findall(r'href="/n/(\d+)"', drawing))) == sorted(view.nodes)
    lanes = int(re.search(r"(\d+) lanes", drawing).group(1))  # type: ignore[union-attr]
    branch_points = sum(max(0, n.children - 1) for n in view.nodes.values())
    roots = sum(n.parent_id is None for n in view.nodes.values())
    assert lanes == roots + branch_points
