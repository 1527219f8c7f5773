"""``gyre export`` round trips on real PostgreSQL: every column read back equals the store's value.

The run is recorded without a live run: tracegen executions and one hand-made execution whose
outputs crossed a publication, evaluated, and two groups consumed by a "trainer" (the buffer's
``take``, as a live run's core calls it) with the settings of the run's ``run.configured``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from gyre_store import (
    EventMetadata,
    FinishReason,
    ModelCallRecorded,
    NewEvent,
    PostgresEventLog,
    PostgresProjectionStore,
    Provenance,
    RunConfigured,
    RunStarted,
    StreamId,
    TitoArrays,
    catch_up,
    new_record,
)
from gyre_store.trees import TreeView
from gyre_tools import cli
from gyre_train import (
    AdmissionConfig,
    AdvantageConfig,
    CallableEvaluator,
    EvaluationConfig,
    EvaluationRunner,
    GroupSourceConfig,
    ReadyGroup,
    StoreGroupSource,
)
from tests.unit.train.runs import dispatch_group, finish, projections, record_trace, start

RUN = "export-run"
SEED, JMAX = 7, 2
CONFIG_TOML = f"seed = {SEED}\n\n[train]\njmax = {JMAX}\nscale_advantages = false\n"
TRAINED = GroupSourceConfig(
    AdmissionConfig(max_trajectories=JMAX), AdvantageConfig(scale_by_std=False), seed=SEED, run_id=RUN
)
SCORES = {"ex-e0": 1.0, "ex-e1": 0.25, "ex-e2": 0.5, "ex-e3": 0.0, "ex-e4": 0.75, "ex-e5": 0.1}
GROUPS = {
    "ex-e0": "ex-g0",
    "ex-e1": "ex-g0",
    "ex-e2": "ex-g0",
    "ex-e3": "ex-g1",
    "ex-e4": "ex-g1",
    "ex-e5": "ex-g2",
}
HAND = "ex-e2"  # the hand-made execution: its outputs name weight versions


def _hand_made(log: PostgresEventLog) -> None:
    """Two calls whose outputs were sampled under versions 3 then 4 (the first crossed a publication)."""

    def arrays(inp: list[tuple[int, Provenance]], ends: list[int], out: list[int]) -> TitoArrays:
        return TitoArrays(
            input_ids=np.array([t for t, _ in inp], "<i4"), input_prov=np.array([p for _, p in inp], "|u1"),
            msg_ends=np.array(ends, "<i4"), msg_hashes=np.zeros(4 * len(ends), "<u4"),
            output_ids=np.array(out, "<i4"),
            output_logprobs=np.linspace(-0.9, -0.1, len(out)).astype("<f4"),
            output_prov=np.full(len(out), Provenance.SAMPLED, "|u1"),
            output_trainable=np.ones(len(out), np.bool_), output_hash=np.zeros(0, "<u4"),
        )  # fmt: skip

    first = ModelCallRecorded(
        execution_id=HAND, run_id=RUN, request_id="r1", weight_versions=((0, 3), (2, 4))
    )
    log.append(
        [new_record(first, arrays([(1, Provenance.SYSTEM), (2, Provenance.USER)], [1, 2], [10, 11, 12]))]
    )
    second = ModelCallRecorded(
        execution_id=HAND,
        run_id=RUN,
        request_id="r2",
        prefix_of="r1",
        prefix_len=5,
        weight_versions=((0, 4),),
    )
    log.append(
        [new_record(second, arrays([(3, Provenance.TOOL_RESULT), (4, Provenance.USER)], [6, 7], [13, 14]))]
    )


def _record_run(log: PostgresEventLog) -> list[tuple[int, ReadyGroup]]:
    """The run's events; returns what its trainer took, by step."""
    meta = EventMetadata(run_id=RUN)
    started = RunStarted(
        run_id=RUN,
        harness="claude-code",
        model="tiny",
        group_size=3,
        batch_groups=1,
        cells=1,
        cell_capacity=4,
    )
    log.append(
        [NewEvent(started, metadata=meta), NewEvent(RunConfigured(run_id=RUN, config_toml=CONFIG_TOML))]
    )
    dispatch_group(log, RUN, "ex-g0", ["ex-e0", "ex-e1", "ex-e2"], policy_version=0)
    dispatch_group(log, RUN, "ex-g1", ["ex-e3", "ex-e4"], policy_version=1)
    dispatch_group(log, RUN, "ex-g2", ["ex-e5"], policy_version=2)  # ready, never trained on
    for seed, execution in enumerate(("ex-e0", "ex-e1", "ex-e3", "ex-e4", "ex-e5"), start=11):
        record_trace(log, execution, RUN, seed=seed)
    _hand_made(log)
    runner = EvaluationRunner(
        log, CallableEvaluator(lambda s: SCORES[s.execution_id], name="judge"), EvaluationConfig()
    )
    for execution in SCORES:
        start(log, execution, RUN)
        finish(log, execution, RUN, FinishReason.COMPLETED)
        runner.preserve(execution, "w")
        runner.settle(execution, deadline=float("inf"))
    store = PostgresProjectionStore(log.pool, projections().tables())
    taken = []
    for step, group in ((0, "ex-g0"), (1, "ex-g1")):
        source = StoreGroupSource(log, store, TRAINED, step=step)
        assert group in [t.group_id for t in source.ready_groups()]
        taken.append((step, source.take(group)))
    return taken


def _gyre(database_url: str, *argv: str) -> int:
    return cli.main(["export", "--database-url", database_url, "--run", RUN, *argv])


def _view(log: PostgresEventLog, execution_id: str) -> TreeView:
    store = PostgresProjectionStore(log.pool, projections().tables())
    for p in projections():
        catch_up(log, store, p)
    return TreeView.load(store, execution_id)


def _versions_from_events(log: PostgresEventLog, execution_id: str, leaf: str, length: int) -> list[int]:
    """Per-token versions walked from the records' own prefix chain (not the tree): record R
    supplies path positions [R.prefix_len, its end); its outputs carry its weight spans."""
    records = {}
    for r in log.read_stream(StreamId("calls", execution_id)):
        assert isinstance(r.event, ModelCallRecorded) and r.payload is not None
        records[r.event.request_id] = (r.event, TitoArrays.from_payload(r.payload))
    versions = [-1] * length
    current: str | None = leaf
    limit = length
    while current is not None:
        event, arrays = records[current]
        input_len = event.prefix_len + arrays.input_len
        for pos in range(max(input_len, 0), min(input_len + arrays.output_len, limit)):
            spans = [v for first, v in event.weight_versions if first <= pos - input_len]
            versions[pos] = spans[-1] if spans else -1
        limit = min(limit, event.prefix_len)
        current = event.prefix_of
    return versions


def _check_rows(
    log: PostgresEventLog, rows: list[dict[str, Any]], taken: list[tuple[int, ReadyGroup]]
) -> None:
    expected = [
        (step, group, execution, row)
        for step, group in taken
        for execution in group.executions
        for row in execution.rows
    ]
    assert len(rows) == len(expected) > 0
    assert {r["execution_id"] for r in rows} >= {HAND, "ex-e0", "ex-e3"}
    views: dict[str, TreeView] = {}
    for got, (step, group, execution, row) in zip(rows, expected, strict=True):
        assert got["run_id"] == RUN and got["step"] == step
        assert (got["group_id"], got["group_policy_version"]) == (group.group_id, group.policy_version)
        assert (got["execution_id"], got["trajectory"]) == (execution.execution_id, row.trajectory)
        assert got["advantage"] == pytest.approx(execution.advantage, abs=0) and np.isfinite(got["advantage"])
        assert got["token_ids"] == row.token_ids.tolist()
        assert got["target_mask"] == row.target_mask.tolist()
        assert np.array_equal(np.asarray(got["behaviour_logprobs"], np.float32), row.behaviour_logprobs)
        assert (got["num_tokens"], got["target_count"]) == (len(row), row.target_count)
        view = views.setdefault(row.execution_id, _view(log, row.execution_id))
        leaf = view.records[got["leaf_request_id"]]
        assert got["leaf_class"] == leaf.leaf_class.value
        tokens, provenance = view.sequence(leaf.end_node)
        assert got["token_ids"] == tokens[: len(row)].tolist()  # the row is its leaf's path
        assert got["provenance"] == provenance[: len(row)].tolist()
        assert all(
            p == Provenance.SAMPLED for p, m in zip(got["provenance"], got["target_mask"], strict=True) if m
        )
        versions = _versions_from_events(log, row.execution_id, leaf.request_id, len(row))
        assert got["policy_versions"] == versions
        assert got["target_policy_versions"] == sorted(
            {v for v, m in zip(versions, got["target_mask"], strict=True) if m and v >= 0}
        )
    hand = [r for r in rows if r["execution_id"] == HAND]
    assert [r["target_policy_versions"] for r in hand] == [[3, 4]]  # spans (0, 3), (2, 4) and (0, 4)
    assert hand[0]["policy_versions"] == [-1, -1, 3, 3, 4, -1, -1, 4, 4]


def test_parquet_round_trip_through_pyarrow_and_datasets(
    pg_log: PostgresEventLog, database_url: str, tmp_path: Path
) -> None:
    taken = _record_run(pg_log)
    out = tmp_path / "run.parquet"
    assert _gyre(database_url, "--format", "parquet", "--out", str(out)) == 0
    table = pq.read_table(out)
    assert str(table.schema.field("token_ids").type) == "list<element: int32>"
    assert str(table.schema.field("behaviour_logprobs").type) == "list<element: float>"
    _check_rows(pg_log, table.to_pylist(), taken)
    datasets = pytest.importorskip("datasets")
    loaded = datasets.load_dataset(
        "parquet", data_files=str(out), split="train", cache_dir=str(tmp_path / "hf")
    )
    _check_rows(pg_log, list(loaded), taken)
    assert not list(tmp_path.glob(".*.partial"))


def test_jsonl_round_trip_through_json_and_datasets(
    pg_log: PostgresEventLog, database_url: str, tmp_path: Path
) -> None:
    taken = _record_run(pg_log)
    out = tmp_path / "run.jsonl"
    assert _gyre(database_url, "--format", "jsonl", "--out", str(out)) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    _check_rows(pg_log, rows, taken)
    datasets = pytest.importorskip("datasets")
    loaded = datasets.load_dataset("json", data_files=str(out), split="train", cache_dir=str(tmp_path / "hf"))
    _check_rows(pg_log, list(loaded), taken)


# ATIF v1.4 as Harbor publishes it (docs/rfcs/0001-trajectory-format.md in laude-institute/harbor),
# restated for the fields gyre writes: (type, required) per field, per object.
ROOT = {"schema_version": (str, True), "session_id": (str, True), "agent": (dict, True),
        "steps": (list, True), "notes": (str, False), "final_metrics": (dict, False), "extra": (dict, False)}  # fmt: skip
AGENT = {"name": (str, True), "version": (str, True), "model_name": (str, False), "extra": (dict, False)}
STEP = {"step_id": (int, True), "timestamp": (str, False), "source": (str, True), "model_name": (str, False),
        "reasoning_effort": ((str, float), False), "message": (str, True), "reasoning_content": (str, False),
        "tool_calls": (list, False), "observation": (dict, False), "metrics": (dict, False),
        "extra": (dict, False)}  # fmt: skip
AGENT_ONLY = ("model_name", "reasoning_effort", "reasoning_content", "tool_calls", "metrics")
TOOL_CALL = {"tool_call_id": (str, True), "function_name": (str, True), "arguments": (dict, True)}
OBSERVATION = {"results": (list, True)}
RESULT = {"source_call_id": (str, False), "content": (str, False), "subagent_trajectory_ref": (list, False)}
METRICS = {"prompt_tokens": (int, False), "completion_tokens": (int, False), "cached_tokens": (int, False),
           "cost_usd": (float, False), "prompt_token_ids": (list, False), "completion_token_ids": (list, False),
           "logprobs": (list, False), "extra": (dict, False)}  # fmt: skip
FINAL = {"total_prompt_tokens": (int, False), "total_completion_tokens": (int, False),
         "total_cached_tokens": (int, False), "total_cost_usd": (float, False), "total_steps": (int, False),
         "extra": (dict, False)}  # fmt: skip


def _conforms(obj: Any, schema: dict[str, tuple[Any, bool]], where: str) -> None:
    assert isinstance(obj, dict), where
    assert set(obj) <= set(schema), f"{where}: fields outside the schema {set(obj) - set(schema)}"
    for name, (kind, required) in schema.items():
        if required:
            assert name in obj, f"{where}: {name} is required"
        if name in obj:
            assert isinstance(obj[name], kind) and not isinstance(obj[name], bool), f"{where}.{name}"


def validate_atif(doc: dict[str, Any]) -> None:
    _conforms(doc, ROOT, "root")
    assert doc["schema_version"] == "ATIF-v1.4"
    _conforms(doc["agent"], AGENT, "agent")
    _conforms(doc.get("final_metrics", {}), FINAL, "final_metrics")
    call_ids: set[str] = set()
    for number, step in enumerate(doc["steps"], start=1):
        _conforms(step, STEP, f"step {number}")
        assert step["step_id"] == number  # ordinal, from 1
        assert step["source"] in ("system", "user", "agent")
        if step["source"] != "agent":
            assert not set(step) & set(AGENT_ONLY), (
                f"step {number}: agent-only fields on a {step['source']} step"
            )
        for call in step.get("tool_calls", []):
            _conforms(call, TOOL_CALL, f"step {number} tool call")
            call_ids.add(call["tool_call_id"])
        if "observation" in step:
            _conforms(step["observation"], OBSERVATION, f"step {number} observation")
            for result in step["observation"]["results"]:
                _conforms(result, RESULT, f"step {number} result")
                if "source_call_id" in result:  # optional; when there, it names a call made so far
                    assert result["source_call_id"] in call_ids
        if "metrics" in step:
            metrics = step["metrics"]
            _conforms(metrics, METRICS, f"step {number} metrics")
            ids, logprobs = metrics.get("completion_token_ids", []), metrics.get("logprobs", [])
            assert all(isinstance(t, int) for t in ids) and all(isinstance(x, float) for x in logprobs)
            assert len(ids) == metrics["completion_tokens"] and len(logprobs) in (0, len(ids))


def test_atif_conforms_to_the_schema_and_matches_the_recorded_calls(
    pg_log: PostgresEventLog, database_url: str, tmp_path: Path
) -> None:
    _record_run(pg_log)
    out = tmp_path / "run.atif.jsonl"
    assert _gyre(database_url, "--format", "atif", "--out", str(out)) == 0
    docs = [json.loads(line) for line in out.read_text().splitlines()]
    views = {e: _view(pg_log, e) for e in SCORES}
    expected_sessions = {f"{e}/{c.request_id}" for e, v in views.items() for c in v.candidates()}
    assert {d["session_id"] for d in docs} == expected_sessions
    tool_calls = observations = 0
    for doc in docs:
        validate_atif(doc)
        assert doc["agent"] == {"name": "claude-code", "version": "unknown", "model_name": "tiny"}
        execution, leaf = doc["session_id"].split("/")
        view = views[execution]
        assert doc["extra"]["execution_id"] == execution and doc["extra"]["run_id"] == RUN
        assert doc["extra"]["group_id"] == GROUPS[execution]
        on_path = set(view.path(view.records[leaf].end_node))
        records = sorted(
            (r for r in view.records.values() if r.end_node in on_path and r.output_len),
            key=lambda r: r.input_len,
        )
        agent = [s for s in doc["steps"] if "metrics" in s]
        assert [s["extra"]["request_id"] for s in agent] == [r.request_id for r in records]
        for step, record in zip(agent, records, strict=True):
            ids, logprobs = view.output_of(record.request_id)
            assert step["metrics"]["completion_token_ids"] == ids.tolist()
            assert np.array_equal(np.asarray(step["metrics"]["logprobs"], np.float32), logprobs)
            assert step["metrics"]["prompt_tokens"] == record.input_len
            assert "<|im_end|>" not in step["message"]  # the turn's end token is markup
        assert doc["final_metrics"]["total_completion_tokens"] == sum(r.output_len for r in records)
        assert doc["steps"][0]["source"] == "system" and doc["steps"][0]["message"]
        tool_calls += sum(len(s.get("tool_calls", [])) for s in doc["steps"])
        observations += sum(len(s.get("observation", {}).get("results", [])) for s in doc["steps"])
    assert tool_calls > 0 and observations > 0  # tracegen's agents call tools and get results
    [hand] = [d for d in docs if d["session_id"].startswith(HAND)]
    # system, user, r1's answer (the tool result its observation), user, r2's answer
    assert [s["source"] for s in hand["steps"]] == ["system", "user", "agent", "user", "agent"]
    assert [len(s.get("observation", {}).get("results", [])) for s in hand["steps"]] == [0, 0, 1, 0, 0]


def test_an_unknown_run_is_one_line(
    pg_log: PostgresEventLog, database_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _record_run(pg_log)
    status = cli.main(["export", "--database-url", database_url, "--run", "no-such-run",
                       "--format", "jsonl", "--out", str(tmp_path / "x.jsonl")])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert (
        status == 2 and len(err.splitlines()) == 1 and "no-such-run" in err and err.startswith("gyre: error:")
    )
    assert not (tmp_path / "x.jsonl").exists()


def test_an_unknown_format_is_refused_by_the_parser(
    database_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        _gyre(database_url, "--format", "csv", "--out", str(tmp_path / "x.csv"))
    assert exit_.value.code == 2
    assert "invalid choice: 'csv'" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["missing/x.parquet", "folder", "a-file/x.parquet", "readonly/x.parquet"])
def test_an_unwritable_out_path_is_one_line(
    database_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    (tmp_path / "folder").mkdir()
    (tmp_path / "a-file").write_text("")
    (tmp_path / "readonly").mkdir(mode=0o500)
    if where.startswith("readonly") and os.access(tmp_path / "readonly", os.W_OK):
        pytest.skip("a read-only folder is writable here (running as root)")
    status = _gyre(database_url, "--format", "parquet", "--out", str(tmp_path / where))
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1 and "--out" in err, err


def test_settings_that_do_not_reproduce_training_are_refused(
    pg_log: PostgresEventLog, database_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _record_run(pg_log)
    # A later run.configured with another seed: the replayed draws no longer match what step 0 recorded.
    pg_log.append([NewEvent(RunConfigured(run_id=RUN, config_toml="seed = 1\n[train]\njmax = 1\n"))])
    status = _gyre(database_url, "--format", "jsonl", "--out", str(tmp_path / "x.jsonl"))
    err = capsys.readouterr().err.strip()
    assert status == 2 and "step 0 recorded" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "x.jsonl").exists()


def test_a_model_folder_without_a_tokenizer_is_one_line(
    database_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = _gyre(
        database_url, "--format", "atif", "--out", str(tmp_path / "x.jsonl"), "--model", str(tmp_path)
    )
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1 and "tokenizer.json" in err, err
