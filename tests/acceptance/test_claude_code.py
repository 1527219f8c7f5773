"""Claude Code itself, unmodified, against the proxy and a reference engine running a script.

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

from gyre_proxy import ProxyConfig, ProxyService, issue_key
from gyre_proxy.engines.refengine import ModelSource, ReferenceEngineConfig, ReferenceEngineServer
from gyre_store import PostgresEventLog, PostgresProjectionStore, StoreConfig, catch_up
from gyre_store.catalog import Provenance
from gyre_store.trees import TreeProjection, TreeView

ROOT = Path(__file__).resolve().parents[2]


def claude_binary() -> str:
    done = subprocess.run(
        ["bash", str(ROOT / "tools/install_claude_code.sh")], capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0:
        pytest.skip(f"CLAUDE CODE COULD NOT BE INSTALLED (npm unreachable?): {done.stderr.strip()[-300:]}")
    return done.stdout.strip().splitlines()[-1]


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


def test_claude_code_runs_through_the_proxy_and_its_tree_is_stored(
    tmp_path: Path, fresh_database_url: str
) -> None:
    claude = claude_binary()
    workspace, home = tmp_path / "ws", tmp_path / "home"
    workspace.mkdir()
    home.mkdir()
    (tmp_path / "script.json").write_text(json.dumps(script(workspace)))
    engine_cfg = ReferenceEngineConfig(
        source=ModelSource(tokenizer="qwen"), max_context=65536, script=tmp_path / "script.json"
    )
    with (
        PostgresEventLog(StoreConfig(fresh_database_url)) as log,
        ReferenceEngineServer(engine_cfg) as engine,
        ProxyService(log, ProxyConfig(engines=[("engine-0", engine.base_url)], context_limit=65536)) as proxy,
    ):
        key = issue_key(log, execution_id="cc-1", run_id="cc", harness="claude-code")
        env = {
            **os.environ,
            "HOME": str(home),
            "IS_SANDBOX": "1",
            "ANTHROPIC_BASE_URL": proxy.base_url,
            "ANTHROPIC_API_KEY": key,
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
        assert proxy.spool.flush(30)

        assert (workspace / "a.txt").read_text() == "hello\n"
        assert (workspace / "b.txt").read_text() == "written by the policy\n"

        p = TreeProjection()
        store = PostgresProjectionStore(log.pool, {t.name: t for t in p.tables})
        catch_up(log, store, p)
        view = TreeView.load(store, "cc-1")

    records = sorted(view.records.values(), key=lambda r: r.seq)
    mains = [r for r in records if r.agent_kind == "main"]
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
