"""Claude Code and Codex, unmodified, under `gyre run`: each harness in a sandbox of its own on a
Harbor task folder, for one step on the reference engine. Claude Code runs under bwrap, Codex
under podman (in the task's image), so that one run per harness covers both confined ways.

One run per harness (an untrained policy: the machinery, not learning, is what these tests
hold): every execution started its harness in a sandbox that reaches only the proxy, recorded
its model calls, was evaluated by the task's tests in a sandbox and was trained on. The config
check that refuses a context too small for a harness's first request is tested in
tests/unit/test_run_config.py.

Fails when bubblewrap, or podman and its base image, is missing (``GYRE_TEST_SKIP_BWRAP=1``,
``GYRE_TEST_SKIP_PODMAN=1`` skip them) or when npm cannot install a harness
(``GYRE_TEST_SKIP_HARNESSES=1``).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gyre_proxy.harness import plugin_for
from tests.acceptance.conftest import ROOT
from tests.acceptance.processes import (
    SANDBOX_UIDS,
    gyre_run,
    live_run_env,
    run_events,
    sandbox_missing,
    sandbox_run_folder,
)
from tests.real_servers import harness_binary, require

pytestmark = pytest.mark.timeout(1500)  # a live run of real processes with a real harness

HARBOR = ROOT / "tests" / "fixtures" / "harbor"
HARNESSES = {
    # harness: (installer, the launcher's variable naming the binary, the sandbox kind)
    "claude-code": ("tools/install_claude_code.sh", "GYRE_CLAUDE_BIN", "bwrap"),
    "codex": ("tools/install_codex.sh", "GYRE_CODEX_BIN", "podman"),
}


def config(harness: str, kind: str) -> str:
    context = plugin_for(harness).first_request_tokens + 4096  # the first request, then some turns
    return f"""
seed = 7
steps = 1
policy = "async"
B = 1
N = 2
cells = 1
rollout_engines = 1
engine_capacity = 2
harness = "{harness}"
[model]
init = "random"
max_context = {context}
max_tokens = 32
[train]
micro_step_tokens = {context}
skip_zero_advantage = false  # an untrained policy's group is often all zero: train on it anyway
[tasks]
source = "{HARBOR}"
heldout_ids = ["write-greeting"]
[sandbox]
kind = "{kind}"
[eval]
heldout = false
"""


@dataclass(frozen=True)
class Run:
    harness: str
    kind: str
    summary: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    run_dir: Path


@pytest.fixture(scope="module", params=sorted(HARNESSES))
def harness_run(request: pytest.FixtureRequest, acceptance_template: str) -> Any:
    from tests import pg

    harness: str = request.param
    installer, variable, kind = HARNESSES[harness]
    binary = harness_binary(harness.replace("-", "_"), ROOT / installer)
    require(kind, sandbox_missing(kind))
    folder = sandbox_run_folder(f"gyre-{harness}-run-", config(harness, kind))
    with pg.database_from(acceptance_template) as url:
        gyre_run(folder, live_run_env(url, folder / "data", **{variable: binary}), timeout=1300)
        summary = json.loads((folder / "run.json").read_text())
        run_dir = folder / "data" / "runs" / summary["run_id"]
        yield Run(harness, kind, summary, run_events(url, summary["run_id"]), run_dir)


def test_every_execution_ran_its_harness_in_a_sandbox_and_was_recorded(harness_run: Run) -> None:
    finished = {b["execution_id"]: b for t, b in harness_run.events if t == "execution.finished"}
    calls = Counter(b["execution_id"] for t, b in harness_run.events if t == "model_call.recorded")
    group_of = {
        b["execution_id"]: b["group_id"] for t, b in harness_run.events if t == "execution.dispatched"
    }
    trained = {b["group_id"] for t, b in harness_run.events if t == "group.consumed"}
    assert sum(group_of.get(e) in trained for e in finished) == 2, finished
    for execution_id, body in finished.items():
        if body["reason"] == "cancelled":  # only a group dispatched ahead, cut short by the run's end
            assert group_of[execution_id] not in trained and "the launcher stopped" in body["detail"], body
            continue
        # An untrained policy's answers are cut at max_tokens: a harness may end itself on that
        # (Codex exits 1 on an incomplete response); it ran, in its sandbox, all the same.
        ended = body["reason"] in ("completed", "harness_timeout") or (
            body["reason"] == "failed" and body["detail"].startswith("harness exited")
        )
        assert ended, body
        assert calls[execution_id] >= 1, f"{execution_id} recorded no model call: {body['detail']}"
        workspace = harness_run.run_dir / "workspaces" / _safe(execution_id) / "workspace"
        assert (
            workspace.stat().st_uid in SANDBOX_UIDS
        )  # the harness wrote as its sandbox's user (bwrap, podman)
    recorded = [b for t, b in harness_run.events if t == "model_call.recorded"]
    assert {b["harness"] for b in recorded} == {harness_run.harness}


def test_every_execution_was_evaluated_in_its_sandbox_and_trained_on(harness_run: Run) -> None:
    recorded = [b for t, b in harness_run.events if t == "evaluation.recorded"]
    assert len(recorded) >= 2 and all(b["evaluator"] == f"tests:{harness_run.kind}" for b in recorded)
    assert all(b["status"] == "valid" for b in recorded)
    [step] = harness_run.summary["steps"]
    assert step["executions"] == 2 and step["admitted_trajectories"] >= 1 and step["trainable_tokens"] > 0
    assert Counter(t for t, _ in harness_run.events)["policy.published"] == 1


def _safe(execution_id: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in execution_id)
