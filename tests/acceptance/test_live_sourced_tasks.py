"""A live run on a Harbor task folder with its harnesses and tests in sandboxes: `gyre run
--config` with `[tasks] source` and `[sandbox] kind = "bwrap"`, then `"podman"`, the way a user
brings their tasks.

One small run (an untrained policy: the machinery, not learning, is what these tests hold)
serves every test of the module: the tasks are recorded by reference, each workspace is written
from the task's files, every execution's harness runs in its own sandbox and reaches the proxy
through the relay (its model calls are recorded), its preserved work is scored by the task's own
tests in a sandbox (reward.json's partial credit included), and the run trains on the groups.

Fails when bubblewrap, or podman and its base image, is missing; ``GYRE_TEST_SKIP_BWRAP=1`` and
``GYRE_TEST_SKIP_PODMAN=1`` skip them instead.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gyre_train.tasks import open_source
from tests.acceptance.conftest import ROOT
from tests.acceptance.processes import (
    SANDBOX_UIDS,
    gyre_run,
    live_run_env,
    run_events,
    sandbox_missing,
    sandbox_run_folder,
)
from tests.real_servers import require

pytestmark = pytest.mark.timeout(1200)  # a live run of real processes

HARBOR = ROOT / "tests" / "fixtures" / "harbor"

CONFIG = """
seed = 5
steps = 1
policy = "async"
phi = 1.0
mu = 1
B = 2
N = 2
cells = 1
rollout_engines = 1
engine_capacity = 4
harness = "builtin"
[model]
init = "random"
max_tokens = 32
[train]
skip_zero_advantage = false  # an untrained policy's groups are often all zero: train on them anyway
[tasks]
source = "{HARBOR}"
heldout_ids = ["write-greeting"]
[sandbox]
kind = "{KIND}"
"""


@dataclass(frozen=True)
class Run:
    kind: str
    database_url: str
    summary: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    folder: Path


@pytest.fixture(scope="module", params=["bwrap", "podman"])
def sourced_run(request: pytest.FixtureRequest, acceptance_template: str) -> Any:
    from tests import pg

    kind: str = request.param
    require(kind, sandbox_missing(kind))
    folder = sandbox_run_folder(f"gyre-sourced-{kind}-", CONFIG.format(HARBOR=HARBOR, KIND=kind))
    with pg.database_from(acceptance_template) as url:
        gyre_run(folder, live_run_env(url, folder / "data"))
        summary = json.loads((folder / "run.json").read_text())
        yield Run(kind, url, summary, run_events(url, summary["run_id"]), folder)


def test_the_tasks_are_recorded_by_reference_to_the_source(sourced_run: Run) -> None:
    defined = [b for t, b in sourced_run.events if t == "task.defined"]
    hashes = {t.id: t.workspace_hash for t in open_source(str(HARBOR)).tasks}
    assert sorted(b["task_id"] for b in defined) == sorted(hashes)
    for body in defined:
        assert body["source"] == str(HARBOR) and body["content_hash"] == hashes[body["task_id"]]
        assert not body.get("files") and not body.get("tests")
    split = {b["task_id"]: b["split"] for b in defined}
    assert split["write-greeting"] == "heldout"


def test_every_execution_ran_in_a_sandbox_and_reached_the_proxy(sourced_run: Run) -> None:
    run_id = sourced_run.summary["run_id"]
    finished = {b["execution_id"]: b for t, b in sourced_run.events if t == "execution.finished"}
    calls = Counter(b["execution_id"] for t, b in sourced_run.events if t == "model_call.recorded")
    group_of = {
        b["execution_id"]: b["group_id"] for t, b in sourced_run.events if t == "execution.dispatched"
    }
    trained = {b["group_id"] for t, b in sourced_run.events if t == "group.consumed"}
    train = [e for e, b in finished.items() if b["run_id"] == run_id and group_of.get(e) in trained]
    assert len(train) >= 4 and len(finished) > len(train)  # the step's groups and the held-out runs
    for execution_id, body in finished.items():
        if body["reason"] == "cancelled" and body["run_id"] == run_id:
            # only a group dispatched ahead (async), not trained on, may be cut short by the run's end
            assert group_of[execution_id] not in trained and "the launcher stopped" in body["detail"], body
            continue
        assert body["reason"] in ("completed", "harness_timeout"), body
        assert calls[execution_id] >= 1, f"{execution_id} recorded no model call: {body['detail']}"
    workspaces = sorted((_run_dir(sourced_run) / "workspaces").glob("*/workspace"))
    assert len(workspaces) == len(finished)
    if sourced_run.kind in ("bwrap", "podman"):  # a prepared container's harness: a user of its own too
        owners = [workspace.stat().st_uid for workspace in workspaces]
        assert all(uid in SANDBOX_UIDS for uid in owners), owners  # the sandbox's user, not the host's root
    assert not [line for line in _launcher_log(sourced_run) if "not started" in line]


def test_preserved_work_is_scored_by_the_tasks_own_tests_in_the_sandbox(sourced_run: Run) -> None:
    recorded = [b for t, b in sourced_run.events if t == "evaluation.recorded"]
    kind = sourced_run.kind
    assert recorded and all(b["evaluator"] == f"tests:{kind}" for b in recorded)
    assert all(b["status"] == "valid" and f" in {kind}, " in b["detail"] for b in recorded)
    task_of = {
        b["execution_id"]: b["task_id"] for t, b in sourced_run.events if t == "execution.start_requested"
    }
    partial = [b for b in recorded if task_of[b["execution_id"]] == "fix-add"]
    # fix-add starts with sub right and add wrong: reward.json's parts give half credit untouched.
    assert all("reward.json" in b["detail"] for b in partial)
    assert {b["score"] for b in partial} <= {0.5, 1.0}
    assert not [b for t, b in sourced_run.events if t == "placeholder.inserted"]


def test_the_run_trained_on_its_groups(sourced_run: Run) -> None:
    [step] = sourced_run.summary["steps"]
    assert step["groups"] == 2 and step["executions"] == 4
    assert step["admitted_trajectories"] >= 1 and step["trainable_tokens"] > 0
    kinds = Counter(t for t, _ in sourced_run.events)
    assert kinds["train.computed"] > 0 and kinds["policy.published"] == 1
    assert sourced_run.summary["eval"]["tasks"] == 1  # write-greeting, held out by the config


def _launcher_log(run: Run) -> list[str]:
    path = _run_dir(run) / "logs" / "launcher.log"
    return path.read_text().splitlines() if path.exists() else []


def _run_dir(run: Run) -> Path:
    return run.folder / "data" / "runs" / run.summary["run_id"]
