"""``gyre ui``'s pages through FastAPI's TestClient on real PostgreSQL: what each page shows is
what the store holds, at the head and at an earlier log position.

The run is recorded without a live run (as ``test_export`` records one): tracegen executions,
evaluated, two groups consumed by the packing buffer's ``take``, a training update and a
closed batch per step.
"""

from __future__ import annotations

import html
import itertools
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gyre_store import (
    BatchClosed,
    EventMetadata,
    FinishReason,
    InMemoryProjectionStore,
    NewEvent,
    PostgresEventLog,
    PostgresProjectionStore,
    RunConfigured,
    RunStarted,
    StreamId,
    TrainingUpdate,
    TreeProjection,
    TreeView,
    catch_up,
    run_report,
)
from gyre_tools.ui.app import create_app
from gyre_train import (
    AdmissionConfig,
    CallableEvaluator,
    EvaluationConfig,
    EvaluationRunner,
    GroupSourceConfig,
    ReadyGroup,
    StoreGroupSource,
)
from tests.unit.train.runs import dispatch_group, finish, projections, record_trace, start

RUN = "ui-run"
SEED, JMAX = 5, 3
SCORES = {"ui-e0": 1.0, "ui-e1": 0.25, "ui-e2": 0.5, "ui-e3": 0.0}
GROUPS = {"ui-g0": ["ui-e0", "ui-e1"], "ui-g1": ["ui-e2", "ui-e3"]}


def _record_run(log: PostgresEventLog) -> tuple[list[tuple[int, ReadyGroup]], dict[str, int]]:
    """The run's events; returns what training took by step, and positions to replay at."""
    log.append(
        [
            NewEvent(
                RunStarted(run_id=RUN, harness="claude-code", model="tiny", group_size=2, batch_groups=1,
                           cells=1, cell_capacity=4, phi=1.0, mu=1, max_trajectories=JMAX),
                metadata=EventMetadata(run_id=RUN),
            ),
            NewEvent(RunConfigured(run_id=RUN, config_toml=f"seed = {SEED}\n\n[train]\njmax = {JMAX}\n")),
        ]
    )  # fmt: skip
    marks = {}
    for version, (group, members) in enumerate(GROUPS.items()):
        dispatch_group(log, RUN, group, members, policy_version=version)
    for seed, execution in enumerate(SCORES, start=3):
        record_trace(log, execution, RUN, seed=seed)
    marks["recorded"] = log.head()
    runner = EvaluationRunner(
        log, CallableEvaluator(lambda s: SCORES[s.execution_id], name="judge"), EvaluationConfig()
    )
    for execution in SCORES:
        start(log, execution, RUN)
        finish(log, execution, RUN, FinishReason.COMPLETED)
        runner.preserve(execution, "w")
        runner.settle(execution, deadline=float("inf"))
    marks["evaluated"] = log.head()
    store = PostgresProjectionStore(log.pool, projections().tables())
    config = GroupSourceConfig(AdmissionConfig(max_trajectories=JMAX), seed=SEED, run_id=RUN)
    taken = []
    for step, group in enumerate(GROUPS):
        source = StoreGroupSource(log, store, config, step=step)
        assert group in [g.group_id for g in source.ready_groups()]  # reads the groups up to the head
        taken.append((step, source.take(group)))
        log.append(
            [
                NewEvent(TrainingUpdate(run_id=RUN, batch=step, policy_version=step + 1, cells=[0], micro_steps=1,
                                        loss=0.5 + step, grad_norm=2.0 * (step + 1), final=True)),
                NewEvent(BatchClosed(run_id=RUN, step=step)),
            ]
        )  # fmt: skip
        marks[f"step{step}"] = log.head()
    return taken, marks


@pytest.fixture
def recorded(
    pg_log: PostgresEventLog,
) -> Iterator[tuple[TestClient, list[tuple[int, ReadyGroup]], dict[str, int]]]:
    taken, marks = _record_run(pg_log)
    with TestClient(create_app(pg_log, poll_s=60)) as client:
        yield client, taken, marks


def _figures(page: str) -> list[tuple[str, Any]]:
    """Every figure a page shows: (its key, its exact value)."""
    return [
        (k, json.loads(html.unescape(v)))
        for k, v in re.findall(r'data-key="([^"]+)" data-value=\'([^\']*)\'', page)
    ]


def _step_rows(page: str) -> dict[int, dict[str, Any]]:
    rows = re.findall(r'<tr data-step="(\d+)">(.*?)</tr>', page, re.S)
    return {int(step): dict(_figures(row)) for step, row in rows}


def test_the_run_page_shows_the_run_report_figures(recorded: Any, pg_log: PostgresEventLog) -> None:
    client, _, _ = recorded
    index = client.get("/")
    assert index.status_code == 200 and f'href="/runs/{RUN}"' in index.text
    page = client.get(f"/runs/{RUN}")
    assert page.status_code == 200
    report = run_report(pg_log, RUN, phi=1.0, mu=1)
    rows = _step_rows(page.text)
    assert sorted(rows) == [s.step for s in report.steps] == [0, 1]
    for s in report.steps:
        row = rows[s.step]
        for key in ("policy_version", "mean_reward", "groups", "executions", "admitted_trajectories",
                    "trainable_tokens", "loss", "grad_norm", "staleness_mean", "wall_s"):  # fmt: skip
            assert row[key] == getattr(s, key), key
    figures = dict(_figures(page.text.split('id="staleness"')[1]))
    assert figures["measured_mean"] == report.staleness.measured_mean
    assert figures["expected_mean"] == report.staleness.expected_mean == 1.0
    # Each reward point of the chart links to its step.
    assert f'href="/runs/{RUN}/steps/1"><circle' in page.text


def test_a_step_links_every_reward_to_the_evaluation_it_came_from(recorded: Any) -> None:
    client, _, _ = recorded
    step = client.get(f"/runs/{RUN}/steps/0")
    assert step.status_code == 200
    links = re.findall(r'href="/executions/([^"#]+)#evaluation-([^"]+)"><span class="fig" data-key="reward" '
                       r"data-value='([^']*)'", step.text)  # fmt: skip
    assert {e for e, _, _ in links} == set(GROUPS["ui-g0"])
    for execution, evaluation, value in links:
        assert float(value) == SCORES[execution]
        page = client.get(f"/executions/{execution}").text
        anchored = page.split(f'id="evaluation-{evaluation}"')[1].split("</div>")[0]
        assert f"data-key=\"score\" data-value='{SCORES[execution]}'" in anchored
    assert client.get(f"/runs/{RUN}/steps/7").status_code == 404


def test_the_execution_view_draws_the_tree_and_the_admitted_trajectories(
    recorded: Any, pg_log: PostgresEventLog
) -> None:
    folding, taken, _ = recorded
    store = PostgresProjectionStore(pg_log.pool, projections().tables())
    catch_up(pg_log, store, TreeProjection())
    # As gyre ui serves it (trees at the head read from the projection), and folded from records.
    projected = TestClient(create_app(pg_log, store=store, poll_s=60))
    for (step, group), client in itertools.product(taken, (projected, folding)):
        for execution in group.executions:
            view = TreeView.load(store, execution.execution_id)
            page = client.get(f"/executions/{execution.execution_id}").text
            drawn = set(map(int, re.findall(r'class="node" data-node="(\d+)"', page)))
            assert drawn == set(view.nodes)
            admitted = re.findall(r"<tr><td>(\d+)</td><td><a href=\"[^\"]+/nodes/(\d+)\">.*?data-key=\"target_count\" "
                                  r"data-value='(\d+)'", page, re.S)  # fmt: skip
            assert [(int(d), int(t)) for d, _, t in admitted] == [
                (r.trajectory, r.target_count) for r in execution.rows
            ]
            assert f"Step {step} consumed the group" in page
            assert {int(leaf) for _, leaf, _ in admitted} <= {c.leaf for c in view.candidates()}


def test_a_node_shows_its_recorded_tokens_with_their_provenance(
    recorded: Any, pg_log: PostgresEventLog
) -> None:
    client, _, _ = recorded
    store = PostgresProjectionStore(pg_log.pool, projections().tables())
    catch_up(pg_log, store, TreeProjection())
    view = TreeView.load(store, "ui-e0")
    names = {
        0: "template",
        1: "system",
        2: "user",
        3: "tool_result",
        4: "injected_assistant",
        5: "critique",
        6: "sampled",
    }
    for node_id in sorted(view.nodes)[:6]:
        page = client.get(f"/executions/ui-e0/nodes/{node_id}").text
        tokens = re.findall(r'class="tok[^"]*" data-id="(\d+)" data-provenance="([a-z_]+)"', page)
        node = view.nodes[node_id]
        assert [int(t) for t, _ in tokens] == node.tokens.tolist()
        assert [p for _, p in tokens] == [names[int(p)] for p in node.provenance]


def test_a_replay_position_shows_the_store_as_it_was(recorded: Any, pg_log: PostgresEventLog) -> None:
    client, _, marks = recorded
    # Before the first step closed: no step, and step 0's page is not there yet.
    page = client.get(f"/runs/{RUN}?at={marks['evaluated']}").text
    assert _step_rows(page) == {} and "replay at log position" in page
    assert client.get(f"/runs/{RUN}/steps/0?at={marks['evaluated']}").status_code == 404
    assert sorted(_step_rows(client.get(f"/runs/{RUN}?at={marks['step0']}").text)) == [0]
    # Before the evaluations: the reward is pending and no step trained on the execution.
    before = client.get(f"/executions/ui-e0?at={marks['recorded']}").text
    assert "(pending)" in before and "not trained on" in before
    assert f'href="/runs/{RUN}?at={marks["recorded"]}"' in before  # links keep the position
    # Halfway through the records: the tree as a projection caught up to there holds it.
    calls = [r.position for r in pg_log.read_stream(StreamId("calls", "ui-e1"))]
    middle = calls[len(calls) // 2]
    store = InMemoryProjectionStore({t.name: t for t in TreeProjection.tables}, pg_log)
    catch_up(pg_log, store, TreeProjection(), until=middle)
    past = TreeView.load(store, "ui-e1")
    page = client.get(f"/executions/ui-e1?at={middle}").text
    assert set(map(int, re.findall(r'class="node" data-node="(\d+)"', page))) == set(past.nodes)
    assert len(past.records) < len(calls)


def test_bad_input_is_one_line(recorded: Any) -> None:
    client, _, _ = recorded
    assert client.get("/runs/nope").status_code == 404
    assert "no execution 'nope'" in html.unescape(client.get("/executions/nope").text)
    bad = client.get("/?at=-1")
    assert bad.status_code == 400 and "a log position is 0 or more" in bad.text
    assert client.get("/executions/ui-e0/nodes/99999").status_code == 404


def test_the_head_moves_as_the_log_grows(recorded: Any, pg_log: PostgresEventLog) -> None:
    client, _, _ = recorded
    before = client.get("/api/head").json()["head"]
    assert before == pg_log.head()
    dispatch_group(pg_log, RUN, "ui-g9", ["ui-e9"], policy_version=2)
    assert client.get("/api/head").json()["head"] > before
    page = client.get(f"/runs/{RUN}").text
    assert f'data-position="{pg_log.head()}"' in page and 'fetch("/api/head")' in page
