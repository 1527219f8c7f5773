"""An execution asks for an evaluation of its work mid-way, through the command in its workspace.

The built-in agent (scripted) writes a wrong answer, runs ``.gyre/evaluate``, and reads the
evaluator's critique as the command's output. The evaluation is bound to the artifact it saw,
the critique comes back from the evaluator worker, and the next request that carries it is
recorded with evaluator-critique provenance: ``gyre_critique_tokens_v`` shows those tokens, and
admission never trains on them.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from gyre_proxy import ProxyConfig, ProxyService
from gyre_proxy.engines.refengine import ModelSource, ReferenceEngineConfig, ReferenceEngineServer
from gyre_proxy.harness import BuiltinHarness
from gyre_proxy.launch import Launcher, LauncherConfig
from gyre_store import (
    ArtifactPreserved,
    EvaluationRecorded,
    EvaluationRequested,
    ExecutionFinished,
    PostgresEventLog,
    PostgresProjectionStore,
    ProjectionSet,
    StoreConfig,
    StreamId,
    TaskSplit,
    catch_up,
    evaluation_projections,
)
from gyre_store.catalog import Provenance
from gyre_store.trees import TreeProjection, TreeView
from gyre_tools.placement import SandboxPlacement
from gyre_train.sandbox import bwrap_missing
from gyre_train.sandbox.users import POOL_FIRST, POOL_SIZE
from gyre_train.tasks import family, instances
from gyre_train.trajectories import stored_execution
from tests.integration.tasks.test_containers import docker_url, podman  # noqa: F401 (fixtures)
from tests.integration.train.launch_and_score import request_execution, run_until
from tests.real_servers import require

RUN = "ask-run"
DISK_MB = 64  # the sandboxed harness's writable binds, the snapshots folder among them, capped


def call(name: str, args: dict[str, str]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


SCRIPT = {
    "rule": "match",
    "outputs": [
        {"when": "<tool_response>\nFAILED", "text": "Done."},
        {"when": "\nOK\n</tool_response>", "text": call("Bash", {"command": "python3 .gyre/evaluate"})},
        {"when": "", "text": call("Write", {"file_path": "answer.txt", "content": "apple wrong\n"})},
    ],
}


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A folder the sandbox's user may pass through (pytest's own are its owner's only)."""
    path = Path(tempfile.mkdtemp(prefix="gyre-ask-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(params=["local", "bwrap", "podman", "docker"])
def kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The sandbox kind; ``docker`` is the Docker Engine API of podman's own service, started
    for this module (``test_containers``' fixtures), named by DOCKER_HOST."""
    kind: str = request.param
    if kind == "bwrap":
        require("bwrap", bwrap_missing())
    elif kind == "podman":
        request.getfixturevalue("podman")
    elif kind == "docker":
        request.getfixturevalue("podman")
        monkeypatch.setenv("DOCKER_HOST", request.getfixturevalue("docker_url"))
    return kind


def test_an_intermediate_evaluations_critique_is_recorded_as_critique(
    database_url: str, open_tmp: Path, kind: str
) -> None:
    """Under ``bwrap``, ``podman`` and ``docker`` the harness runs sandboxed (as nobody, its
    writable binds under a disk cap), writes its snapshot into the execution's snapshots folder
    bound writable at ``/gyre/snapshots``, and asks by the host's path."""
    tmp_path = open_tmp
    [instance] = [i for i in instances("copy-line", family("copy-line"), count=200, split=TaskSplit.TRAIN, seed=0)
                  if i.key.startswith("apple ")][:1]  # fmt: skip
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    engine_config = ReferenceEngineConfig(
        source=ModelSource(tokenizer="qwen"), max_context=8192, script=script
    )
    with (
        ReferenceEngineServer(engine_config) as engine,
        PostgresEventLog(StoreConfig(database_url)) as log,
    ):
        request_execution(log, instance, run_id=RUN, execution_id="ask-e0", group_id="ask-g0", budget_s=120.0)
        store = PostgresProjectionStore(
            log.pool, ProjectionSet([TreeProjection(), *evaluation_projections()]).tables()
        )
        config = ProxyConfig(engines=[("e0", engine.base_url)], harness="builtin", context_limit=8192)
        with ProxyService(log, config) as proxy:
            placement = (
                SandboxPlacement(
                    kind, proxy_url=proxy.base_url, relay_dir=tmp_path / "relay", disk_mb=DISK_MB
                )
                if kind != "local"
                else None
            )
            launcher = Launcher(
                log, LauncherConfig(run_id=RUN, proxy_url=proxy.base_url, root=tmp_path / "ws"),
                plugin=BuiltinHarness(max_turns=5), placement=placement,
            )  # fmt: skip
            try:
                run_until(
                    log, launcher, store, StreamId("execution", "ask-e0"), ExecutionFinished, timeout_s=180
                )
            finally:
                if placement is not None:
                    placement.close()
            proxy.spool.flush()

        history = [r.event for r in log.read_stream(StreamId("evaluation", "ask-e0"))]
        [asked] = [e for e in history if isinstance(e, EvaluationRequested)]
        assert asked.artifact_version.startswith("wip-")
        intermediate = next(
            e
            for e in history
            if isinstance(e, EvaluationRecorded) and e.artifact_version == asked.artifact_version
        )
        assert intermediate.score == 2 / 3 and "second_word" in intermediate.critique  # bound to what it saw
        [preserved] = [
            r.event
            for r in log.read_stream(StreamId("artifact", "ask-e0"))
            if isinstance(r.event, ArtifactPreserved) and r.event.artifact_version == asked.artifact_version
        ]
        snapshot = (tmp_path / "ws" / "ask-e0" / "snapshots" / asked.artifact_version).resolve()
        assert preserved.location == str(snapshot)  # the folder the run recorded, on the host
        assert (snapshot / "answer.txt").read_text() == "apple wrong\n"
        if kind != "local":  # written inside the sandbox by its user, kept past the disk cap's cleanup
            pool = range(POOL_FIRST, POOL_FIRST + POOL_SIZE) if os.geteuid() == 0 else [os.geteuid()]
            assert snapshot.stat().st_uid in pool
            assert not (tmp_path / "ws" / "ask-e0" / "snapshots").is_mount()

        catch_up(log, store, TreeProjection())
        view = TreeView.load(store, "ask-e0")
        nodes = list(view.nodes.values())
        critique_tokens = sum(int((n.provenance == Provenance.CRITIQUE).sum()) for n in nodes)
        assert critique_tokens > 0
        assert not any(
            n.trainable is not None and bool((n.trainable & (n.provenance == Provenance.CRITIQUE)).any())
            for n in nodes
        )
        stored = stored_execution(view)
        assert stored.excluded_critique == critique_tokens  # admission sees them as context only
        with psycopg.connect(database_url) as conn:
            (shown,) = conn.execute(
                "SELECT coalesce(sum(critique_tokens), 0) FROM gyre_critique_tokens_v WHERE execution_id = 'ask-e0'"
            ).fetchone()  # type: ignore[misc]
        assert shown == critique_tokens
