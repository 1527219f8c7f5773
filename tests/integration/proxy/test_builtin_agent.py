"""The built-in agent, started by the launcher, through the real proxy and reference engine.

A scripted policy makes the agent delegate to a sub-agent (which reads a long file, compacts
and reports), write a file, read a long file and compact. The launcher builds the workspace
from the task, issues the key, starts the agent as a process, preserves the workspace and
records how it ended; the stored tree holds all four trajectory classes.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gyre_proxy import ProxyConfig, ProxyService
from gyre_proxy.engines.refengine import ModelSource, ReferenceEngineConfig, ReferenceEngineServer
from gyre_proxy.harness import COMPACT_REQUEST, RESUME, BuiltinHarness
from gyre_proxy.launch import Launcher, LauncherConfig
from gyre_store import (
    ArtifactPreserved,
    ExecutionFinished,
    ExecutionStarted,
    ExecutionStartRequested,
    FinishReason,
    NewEvent,
    PostgresEventLog,
    PostgresProjectionStore,
    StoreConfig,
    StreamId,
    TaskDefined,
    TaskSplit,
    catch_up,
)
from gyre_store.catalog import LeafClass
from gyre_store.trees import TreeProjection, TreeView

RUN = "agent-run"
LONG = "".join(f"line {i}: filler text for the context\n" for i in range(40))


def call(name: str, args: dict[str, str]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


SCRIPT = {
    "rule": "match",
    "outputs": [  # checked in order against the decoded prompt
        {"when": COMPACT_REQUEST[:40], "text": "<summary>the work so far</summary>"},
        {"when": RESUME.strip(), "text": "Finished."},
        {"when": "You are a sub-agent", "text": call("Read", {"file_path": "notes.txt"})},
        {"when": "\nOK\n</tool_response>", "text": call("Read", {"file_path": "input.txt"})},
        {"when": "Finished.", "text": call("Write", {"file_path": "answer.txt", "content": "apple river\n"})},
        {"when": "", "text": call("Agent", {"prompt": "Check notes.txt."})},
    ],
}


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[ReferenceEngineServer]:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    config = ReferenceEngineConfig(source=ModelSource(tokenizer="qwen"), max_context=8192, script=script)
    with ReferenceEngineServer(config) as server:
        yield server


def test_the_launcher_runs_the_builtin_agent_and_its_tree_has_four_classes(
    database_url: str, engine: ReferenceEngineServer, tmp_path: Path
) -> None:
    with PostgresEventLog(StoreConfig(database_url)) as log:
        task = TaskDefined(
            run_id=RUN, task_id="t0", split=TaskSplit.TRAIN, prompt="Read input.txt and copy its line to answer.txt.",
            files={"input.txt": "apple river\n" + LONG, "notes.txt": LONG}, budget_s=120.0,
        )  # fmt: skip
        request = ExecutionStartRequested(execution_id="agent-e0", run_id=RUN, task_id="t0", engine="pool")
        log.append([NewEvent(task), NewEvent(request)])
        proxy_config = ProxyConfig(engines=[("e0", engine.base_url)], harness="builtin", context_limit=8192)
        with ProxyService(log, proxy_config) as proxy:
            launcher = Launcher(
                log,
                LauncherConfig(run_id=RUN, proxy_url=proxy.base_url, root=tmp_path / "ws"),
                plugin=BuiltinHarness(max_turns=6, compact_after=1500),
            )
            stop = threading.Event()
            thread = threading.Thread(target=launcher.run, args=(stop,))
            thread.start()
            try:
                deadline = time.monotonic() + 180
                while not _finished(log, "agent-e0") and time.monotonic() < deadline:
                    time.sleep(0.2)
            finally:
                stop.set()
                thread.join(30)
            proxy.spool.flush()
        lifecycle = [r.event for r in log.read_stream(StreamId("execution", "agent-e0"))]
        started = next(e for e in lifecycle if isinstance(e, ExecutionStarted))
        finished = next(e for e in lifecycle if isinstance(e, ExecutionFinished))
        assert started.engine == "pool"
        assert finished.reason is FinishReason.COMPLETED, finished.detail
        workspace = tmp_path / "ws" / "agent-e0" / "workspace"
        assert (workspace / "answer.txt").read_text() == "apple river\n"
        [preserved] = [r.event for r in log.read_stream(StreamId("artifact", "agent-e0"))]
        assert isinstance(preserved, ArtifactPreserved) and preserved.location == str(workspace)

        store = PostgresProjectionStore(log.pool, {t.name: t for t in TreeProjection.tables})
        catch_up(log, store, TreeProjection())
        view = TreeView.load(store, "agent-e0")
        classes = {c.leaf_class for c in view.candidates()}
        assert classes == {
            LeafClass.MAIN,
            LeafClass.MAIN_SUMMARY,
            LeafClass.SUB_AGENT,
            LeafClass.SUB_AGENT_SUMMARY,
        }


def _finished(log: PostgresEventLog, execution_id: str) -> bool:
    return any(
        isinstance(r.event, ExecutionFinished) for r in log.read_stream(StreamId("execution", execution_id))
    )
