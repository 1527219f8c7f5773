"""A judge on the run's own policy or one of its engines, through the run's proxy, on the
reference engine and real PostgreSQL.

``gyre run``'s evaluator (``sourced_evaluators``) scores a Harbor task with a rubric with
``[eval] judge = "policy"`` or ``"engine:NAME"``: each call is an execution of the side run
``<run>~judge`` whose model calls the proxy records, joined in SQL to its ``judge.called`` event
(the documented query); the side run is in no rollout group, so nothing of it is trained on,
and evaluator workers do not evaluate its executions. A call to an engine that is not serving
is a recorded failure, retried as any evaluator failure.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg
import pytest

from gyre_proxy import ProxyConfig, ProxyService
from gyre_proxy.engines.refengine import ModelSource, ReferenceEngineConfig, ReferenceEngineServer
from gyre_proxy.harness import BuiltinHarness
from gyre_proxy.launch import Launcher, LauncherConfig
from gyre_store import (
    ApiKeyRevoked,
    EngineRegistered,
    EvaluationRecorded,
    EvaluationRequested,
    EvaluationStatus,
    ExecutionDispatched,
    ExecutionFinished,
    ExecutionStarted,
    ExecutionStartRequested,
    FinishReason,
    JudgeCalled,
    ModelCallRecorded,
    NewEvent,
    PostgresEventLog,
    PostgresProjectionStore,
    ProjectionSet,
    RewardAssigned,
    StreamId,
    catch_up,
    evaluation_projections,
)
from gyre_store.catalog import Provenance
from gyre_store.trees import TreeProjection, TreeView
from gyre_tools.placement import SandboxPlacement
from gyre_tools.proxy import register_proxy
from gyre_tools.run_config import parse_config
from gyre_tools.serve import sourced_evaluators
from gyre_train import (
    EngineJudgeClient,
    EvaluationConfig,
    EvaluationRunner,
    EvaluatorWorker,
    InvalidEvaluationError,
    JudgeEvaluator,
    RewardStatus,
    WorkerConfig,
)
from gyre_train.tasks import defined_tasks
from gyre_train.trajectories import stored_execution
from tests.unit.train.runs import dispatch_group, finish, start

RUN = "judge-run"  # the run the documented queries name
DOC = Path(__file__).resolve().parents[3] / "docs" / "judge.md"
HARBOR = Path(__file__).resolve().parents[2] / "fixtures" / "harbor"
KEY_RECHECK_S = 1.1  # StoreKeys' default recheck_s, and a little
ANSWER = "greeting.txt holds the line, and nothing else.\nSCORE: 0.75"
CRITIQUE = "greeting.txt holds the line, and nothing else."  # the answer less its score line


def _call(name: str, args: dict[str, str]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


# The policy, scripted: as a judge (the judge's system message) it grades; as the built-in agent
# it writes the file, asks for an evaluation, and stops once the critique comes back.
SCRIPT = {
    "rule": "match",
    "outputs": [
        {"when": "You are a strict grader", "text": ANSWER},
        {"when": f"<tool_response>\n{CRITIQUE}", "text": "Done."},
        {"when": "\nOK\n</tool_response>", "text": _call("Bash", {"command": "python3 .gyre/evaluate"})},
        {"when": "", "text": _call("Write", {"file_path": "greeting.txt", "content": "hello, gyre\n"})},
    ],
}


@dataclass
class Served:
    log: PostgresEventLog
    proxy: ProxyService
    tasks: dict[str, object]


@pytest.fixture
def served(pg_log: PostgresEventLog, tmp_path: Path) -> Iterator[Served]:
    """The reference engine (scripted to answer as a judge) registered as the run's pool engine
    ``pool-0``, and the run's proxy, registered as ``gyre proxy serve`` registers it."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    config = ReferenceEngineConfig(source=ModelSource(tokenizer="qwen"), max_context=4096, script=script)
    with ReferenceEngineServer(config) as engine:
        registered = EngineRegistered(engine=f"{RUN}:pool-0", run_id=RUN, url=engine.base_url, capacity=4)
        pg_log.append([NewEvent(registered)])
        proxy_config = ProxyConfig(
            engines=[], run_id=RUN, harness="builtin", context_limit=4096, max_tokens=128
        )
        with ProxyService(pg_log, proxy_config) as proxy:
            for recorded in pg_log.read(0, types=["engine.registered"]):
                proxy.apply(recorded)  # as its follower does
            register_proxy(pg_log, RUN, proxy.base_url)
            defined = defined_tasks(str(HARBOR), RUN, train=3, heldout=0, seed=0, budget_s=60.0)
            pg_log.append([NewEvent(e) for e in defined])
            yield Served(pg_log, proxy, {e.task_id: e for e in defined})


def _evaluator(served: Served, judge: str) -> tuple[JudgeEvaluator, EngineJudgeClient]:
    config = parse_config(
        f'run_id = "{RUN}"\n[tasks]\nsource = "{HARBOR}"\n[sandbox]\nkind = "bwrap"\n'
        f'[model]\nmax_context = 4096\nmax_tokens = 64\n[eval]\njudge = "{judge}"\n'
    )
    evaluator_for, client = sourced_evaluators(config, served.log)
    assert isinstance(client, EngineJudgeClient)
    evaluator = evaluator_for(served.tasks["write-greeting"])  # type: ignore[arg-type]
    assert isinstance(evaluator, JudgeEvaluator)
    return evaluator, client


def _closed_execution(log: PostgresEventLog, execution_id: str, workspace: Path) -> Path:
    dispatch_group(log, RUN, f"g-{execution_id}", [execution_id])
    start(log, execution_id, RUN)
    finish(log, execution_id, RUN)
    workspace.mkdir()
    (workspace / "greeting.txt").write_text("hello, gyre\n")
    return workspace


def _documented_query(name: str) -> str:
    found = dict(re.findall(r"```sql\n-- audit: (\S+)\n(.*?)```", DOC.read_text(), flags=re.S))
    return found[name]


def test_a_policy_judge_is_a_recorded_side_run_execution_never_trained_on_or_evaluated(
    served: Served, database_url: str, tmp_path: Path
) -> None:
    log = served.log
    workspace = _closed_execution(log, "e0", tmp_path / "ws")
    judge, client = _evaluator(served, "policy")
    with client:
        runner = EvaluationRunner(log, judge, EvaluationConfig(retry_delay_s=0))
        runner.preserve("e0", "v1", location=str(workspace))
        outcome = runner.settle("e0", deadline=float("inf"))
    served.proxy.spool.flush()
    assert (outcome.status, outcome.reward) == (RewardStatus.VALID, 0.75)

    [call] = [r.event for r in log.read_stream(StreamId("judge", "e0")) if isinstance(r.event, JudgeCalled)]
    side = f"{RUN}~judge/{call.call_id}"
    assert (call.judge, call.side_execution, call.score, call.error) == ("policy", side, 0.75, "")
    assert call.endpoint == f"{served.proxy.base_url}/v1/chat/completions" and call.answer == ANSWER

    # The call's life in the side run: started in the pool's slot by the judge, then finished,
    # and its key revoked (it opens nothing afterwards).
    life = [r.event for r in log.read_stream(StreamId("execution", side))]
    assert [type(e) for e in life] == [ExecutionStarted, ExecutionFinished]
    assert (life[0].run_id, life[0].engine, life[0].launcher) == (f"{RUN}~judge", "pool", "judge")  # type: ignore[attr-defined]
    assert life[1].reason is FinishReason.COMPLETED  # type: ignore[attr-defined]
    assert any(isinstance(r.event, ApiKeyRevoked) for r in log.read(0, types=["execution.key_revoked"]))

    # The proxy recorded the judge's tokens as the side execution's model call, on the pool engine.
    [record] = [
        r.event for r in log.read_stream(StreamId("calls", side)) if isinstance(r.event, ModelCallRecorded)
    ]
    assert (record.run_id, record.engine) == (f"{RUN}~judge", f"{RUN}:pool-0")
    tree = PostgresProjectionStore(log.pool, ProjectionSet([TreeProjection()]).tables())
    catch_up(log, tree, TreeProjection())
    nodes = list(TreeView.load(tree, side).nodes.values())
    sampled = sum(int((n.provenance == Provenance.SAMPLED).sum()) for n in nodes)
    assert sampled > 0

    # An evaluator worker of the run passes the side run's finished execution by; the run's own
    # execution it settles from the evaluation already recorded (no second judge call).
    store = PostgresProjectionStore(log.pool, evaluation_projections().tables())
    worker = EvaluatorWorker(log, store, WorkerConfig(run_id=RUN, threads=1))
    try:
        worker.step()
    finally:
        worker.close()
    assert log.read_stream(StreamId("evaluation", side)) == []

    # Nothing of the side run is in a rollout group: no dispatch, so no group ever holds it.
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(_documented_query("judge-model-calls")).fetchall()  # type: ignore[call-overload]
        (grouped,) = conn.execute(
            "SELECT count(*) FROM gyre_events WHERE event_type = 'execution.dispatched' AND run_id LIKE %s",
            (f"{RUN}~judge%",),
        ).fetchone()  # type: ignore[misc]
    assert grouped == 0
    [row] = rows
    assert row[:5] == ("e0", call.call_id, side, "pool", f"{RUN}:pool-0")
    assert row[6] > 0 and row[7] == sampled  # the judge's messages in, its answer out


def test_a_judge_pinned_to_an_engine_that_is_not_serving_is_a_recorded_failure(
    served: Served, tmp_path: Path
) -> None:
    log = served.log
    workspace = _closed_execution(log, "e1", tmp_path / "ws")
    judge, client = _evaluator(served, "engine:pool-1")  # a pool engine of the config, not registered
    with client:
        runner = EvaluationRunner(log, judge, EvaluationConfig(retry_delay_s=0))
        runner.preserve("e1", "v1", location=str(workspace))
        with pytest.raises(InvalidEvaluationError, match="no engine is accepting requests"):
            runner.evaluate("e1")  # an evaluation.failed: pending, retried
        pinned, pinned_client = _evaluator(served, "engine:pool-0")
        with pinned_client:
            recorded = EvaluationRunner(log, pinned, EvaluationConfig(retry_delay_s=0)).evaluate("e1")
    assert recorded.score == 0.75 and recorded.status is EvaluationStatus.VALID  # type: ignore[union-attr]

    failed, answered = [
        r.event for r in log.read_stream(StreamId("judge", "e1")) if isinstance(r.event, JudgeCalled)
    ]
    assert failed.score is None and "no engine is accepting requests" in failed.error
    [finished] = [r.event for r in log.read_stream(StreamId("execution", failed.side_execution))][1:]
    assert isinstance(finished, ExecutionFinished) and finished.reason is FinishReason.FAILED
    assert "no engine is accepting requests" in finished.detail
    started = log.read_stream(StreamId("execution", answered.side_execution))[0].event
    assert isinstance(started, ExecutionStarted) and started.engine == f"engine:{RUN}:pool-0"
    # The answered call went to the pinned engine. The proxy's spool writes its record after the
    # answer went out, so it may land a moment after the judge has its answer.
    deadline = time.monotonic() + 30
    while not (
        records := [
            r.event
            for r in log.read_stream(StreamId("calls", answered.side_execution))
            if isinstance(r.event, ModelCallRecorded)
        ]
    ):
        assert time.monotonic() < deadline, "the judge's answered call was never recorded"
        time.sleep(0.1)
    [record] = records
    assert record.engine == f"{RUN}:pool-0"


def test_a_judge_calls_key_opens_nothing_once_its_call_is_done(served: Served, tmp_path: Path) -> None:
    """The key of a finished call is revoked: the proxy refuses it (401), so nothing can write
    into the side run's execution afterwards."""
    log = served.log
    workspace = _closed_execution(log, "e2", tmp_path / "ws")
    keys: list[str] = []

    class Keeping(httpx.HTTPTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            keys.append(request.headers["authorization"].removeprefix("Bearer "))
            return super().handle_request(request)

    proxy_url = served.proxy.base_url
    with EngineJudgeClient(log, RUN, slot="pool", proxy_url=lambda: proxy_url, transport=Keeping()) as client:
        judge = JudgeEvaluator(
            client, log, judge="policy", prompt="Greet.", rubric="A greeting.", task_id="t"
        )
        runner = EvaluationRunner(log, judge, EvaluationConfig(retry_delay_s=0))
        runner.preserve("e2", "v1", location=str(workspace))
        assert runner.evaluate("e2").score == 0.75  # type: ignore[union-attr]
    [key] = keys
    time.sleep(KEY_RECHECK_S)  # the proxy reads revocations at most this long after they happen
    refused = httpx.post(
        f"{proxy_url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": "gyre-policy", "messages": [{"role": "user", "content": "more"}], "max_tokens": 4},
        timeout=30,
    )
    assert refused.status_code == 401


def test_the_policy_judging_its_own_execution_midway_returns_a_critique_that_is_never_trained_on(
    served: Served, database_url: str, tmp_path: Path
) -> None:
    """A running execution asks for an evaluation (``.gyre/evaluate``); the policy judges it
    through the proxy (a side-run execution), and the critique comes back to the execution as
    the command's output: the proxy records those tokens with critique provenance, and they are
    context only, never a target, when the execution is admitted for training."""
    log = served.log
    tasks = tmp_path / "tasks.jsonl"
    row = {
        "id": "greet", "prompt": "Write `hello, gyre` to greeting.txt.", "files": {"README": "greet\n"},
        "test_command": "test -f greeting.txt", "budget_s": 120, "split": "train",
        "rubric": "greeting.txt holds exactly the line `hello, gyre`.",
    }  # fmt: skip
    tasks.write_text(json.dumps(row) + "\n")
    config = parse_config(
        f'run_id = "{RUN}"\n[tasks]\nsource = "{tasks}"\n[model]\nmax_context = 4096\nmax_tokens = 128\n'
        '[eval]\njudge = "policy"\n'
    )
    [task] = defined_tasks(str(tasks), RUN, train=1, heldout=0, seed=0, budget_s=120.0)
    dispatched = ExecutionDispatched(execution_id="ask", run_id=RUN, group_id="g-ask", policy_version=0)
    asked = ExecutionStartRequested(execution_id="ask", run_id=RUN, task_id="greet", engine="pool")
    log.append([NewEvent(task), NewEvent(dispatched), NewEvent(asked)])
    evaluator_for, client = sourced_evaluators(config, log)
    assert client is not None
    store = PostgresProjectionStore(
        log.pool, ProjectionSet([TreeProjection(), *evaluation_projections()]).tables()
    )
    launcher = Launcher(
        log,
        LauncherConfig(run_id=RUN, proxy_url=served.proxy.base_url, root=tmp_path / "ws"),
        plugin=BuiltinHarness(max_turns=5),
        placement=SandboxPlacement("local", proxy_url=served.proxy.base_url, relay_dir=tmp_path / "relay"),
    )
    worker = EvaluatorWorker(log, store, WorkerConfig(run_id=RUN), evaluator_for=evaluator_for)
    stop = threading.Event()
    threads = [threading.Thread(target=t.run, args=(stop,)) for t in (launcher, worker)]
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any(
            isinstance(r.event, RewardAssigned) for r in log.read_stream(StreamId("evaluation", "ask"))
        ):
            time.sleep(0.2)
    finally:
        stop.set()
        for thread in threads:
            thread.join(90)
        client.close()
    served.proxy.spool.flush()

    history = [r.event for r in log.read_stream(StreamId("evaluation", "ask"))]
    [request] = [e for e in history if isinstance(e, EvaluationRequested)]
    midway = next(
        e
        for e in history
        if isinstance(e, EvaluationRecorded) and e.artifact_version == request.artifact_version
    )
    assert (midway.score, midway.critique) == (0.75, CRITIQUE)
    [reward] = [e for e in history if isinstance(e, RewardAssigned)]
    assert reward.reward == 0.75  # the final workspace, judged by the policy too
    calls = [r.event for r in log.read_stream(StreamId("judge", "ask")) if isinstance(r.event, JudgeCalled)]
    assert {c.artifact_version for c in calls} >= {request.artifact_version}
    assert all(c.side_execution.startswith(f"{RUN}~judge/") for c in calls)

    catch_up(log, store, TreeProjection())
    nodes = list(TreeView.load(store, "ask").nodes.values())
    critique_tokens = sum(int((n.provenance == Provenance.CRITIQUE).sum()) for n in nodes)
    assert critique_tokens > 0
    assert not any(
        n.trainable is not None and bool((n.trainable & (n.provenance == Provenance.CRITIQUE)).any())
        for n in nodes
    )
    assert stored_execution(TreeView.load(store, "ask")).excluded_critique == critique_tokens
    with psycopg.connect(database_url) as conn:
        (shown,) = conn.execute(
            "SELECT coalesce(sum(critique_tokens), 0) FROM gyre_critique_tokens_v WHERE execution_id = 'ask'"
        ).fetchone()  # type: ignore[misc]
    assert shown == critique_tokens
    # The judge's own side executions hold no critique: their tokens are the judge's messages and answers.
    for call in calls:
        judged = TreeView.load(store, call.side_execution).nodes.values()
        assert not any(bool((n.provenance == Provenance.CRITIQUE).any()) for n in judged)
