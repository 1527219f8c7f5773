"""Claude Code itself, unmodified, against `gyre proxy serve` and `gyre engine serve` running a
script, registered with `gyre executions new`, all as processes the way the README says.

The scripted policy makes Claude Code call Bash, Write and the Agent tool (a sub-agent that
runs in the background), then `/compact` the session. The files appear in the workspace,
and the stored tree has a main root, a sub-agent root, tool results as harness tokens and
the compaction branch, every request after the first extending its predecessor's context.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from gyre_proxy.harness import ClaudeCodeHarness
from gyre_store.catalog import Provenance
from tests.acceptance.conftest import gyre
from tests.acceptance.processes import engine_and_proxy, settled_records, tree
from tests.real_servers import harness_binary

ROOT = Path(__file__).resolve().parents[2]


def claude_binary() -> str:
    return harness_binary("claude_code", ROOT / "tools/install_claude_code.sh")


def script(workspace: Path) -> dict[str, object]:
    def call(name: str, args: dict[str, str]) -> str:
        return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"

    # Checked in order against the prompt text: the most specific situation first.
    return {
        "rule": "match",
        "outputs": [
            {
                "when": "Please provide your summary based on the conversation so far",
                "text": "<analysis>\nFiles were made.\n</analysis>\n<summary>\nThe user asked for files; a.txt and b.txt were created and checked.\n</summary>",
            },
            {"when": 'Agent "check files" finished', "text": "Done: a.txt and b.txt exist."},
            {"when": "The agent is working in the background", "text": "Waiting for the sub-agent."},
            {
                "when": "File created successfully",
                "text": call(
                    "Agent",
                    {
                        "description": "check files",
                        "prompt": "List the files in the workspace and report.",
                        "subagent_type": "general-purpose",
                    },
                ),
            },
            {
                "when": "Bash completed",
                "text": call(
                    "Write", {"file_path": str(workspace / "b.txt"), "content": "written by the policy\n"}
                ),
            },
            {
                "when": "List the files in the workspace and report.",
                "text": "The workspace has a.txt and b.txt.",
            },
            {
                "when": "Create a.txt",
                "text": "I will create a file.\n\n"
                + call("Bash", {"command": "echo hello > a.txt", "description": "write a file"}),
            },
            {"when": "", "text": "OK."},
        ],
    }


@pytest.mark.timeout(900)
def test_claude_code_runs_through_the_proxy_and_its_tree_is_stored(
    tmp_path: Path, fresh_database_url: str
) -> None:
    claude = claude_binary()
    workspace, home = tmp_path / "ws", tmp_path / "home"
    workspace.mkdir()
    home.mkdir()
    (tmp_path / "script.json").write_text(json.dumps(script(workspace)))
    db = {"GYRE_DATABASE_URL": fresh_database_url}
    # Started the way the README tells users: engine, proxy and registration as processes.
    with engine_and_proxy(fresh_database_url, tmp_path / "script.json", "claude-code", tmp_path) as proxy:
        registered = gyre(
            "executions", "new", "--json", "--harness", "claude-code", "--run-id", "cc",
            "--execution-id", "cc-1", "--proxy-url", proxy, env=db,
        )  # fmt: skip
        assert registered.returncode == 0, registered.stderr
        execution = json.loads(registered.stdout)
        env = {
            **os.environ,
            "HOME": str(home),
            "IS_SANDBOX": "1",
            "ANTHROPIC_BASE_URL": execution["base_url"],
            "ANTHROPIC_API_KEY": execution["api_key"],
            "DISABLE_TELEMETRY": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        }
        first = subprocess.run(
            [claude, "-p", "Create a.txt with the shell, b.txt with Write, then ask a sub-agent to check.", "--dangerously-skip-permissions", "--model", "gyre-policy"],
            cwd=workspace, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert first.returncode == 0, first.stderr[-2000:]
        compact = subprocess.run(
            [claude, "-c", "-p", "/compact", "--dangerously-skip-permissions", "--model", "gyre-policy"],
            cwd=workspace, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert compact.returncode == 0, compact.stderr[-2000:]
        recorded = settled_records(fresh_database_url, "cc-1")

    assert (workspace / "a.txt").read_text() == "hello\n"
    assert (workspace / "b.txt").read_text() == "written by the policy\n"
    view = tree(fresh_database_url, "cc-1")
    assert len(view.records) == len(recorded)
    spawned = [e.spawned_by for e in recorded if e.agent_kind == "sub_agent"]
    assert spawned and all(s is not None and s.startswith("toolu_") for s in spawned)

    records = sorted(view.records.values(), key=lambda r: r.seq)
    mains = [r for r in records if r.agent_kind == "main"]
    # The size the run config's check assumes for Claude Code's first request (within 20%).
    first = len(view.input_of(mains[0].request_id)[0])
    assert 0.8 * ClaudeCodeHarness.first_request_tokens <= first <= ClaudeCodeHarness.first_request_tokens, (
        first
    )
    subs = [r for r in records if r.agent_kind == "sub_agent"]
    assert len(subs) >= 1 and len(mains) >= 5
    roots = {view.nodes[view.path(r.end_node)[0]].root_id for r in records}
    assert len(roots) == 2  # the main agent's context root and the sub-agent's
    # every main request after the first extends the context stored before it
    for before, after in itertools.pairwise(mains):
        before_full = np.concatenate(
            [view.input_of(before.request_id)[0], view.output_of(before.request_id)[0]]
        )
        after_input = view.input_of(after.request_id)[0]
        if after.purpose == "turn":
            np.testing.assert_array_equal(after_input[: len(before_full)], before_full)
    tool_tokens = np.concatenate([view.input_of(r.request_id)[1] for r in mains[1:]])
    assert np.any(tool_tokens == Provenance.TOOL_RESULT)
    classes = {c.leaf_class.value for c in view.candidates()}
    assert "main_summary" in classes and "sub_agent" in classes
