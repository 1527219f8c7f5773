"""Codex itself, unmodified, against `gyre proxy serve` and `gyre engine serve` running a script.

Started the way the README tells users: `gyre engine serve`, `gyre proxy serve --harness codex`
and `gyre executions new --harness codex` as processes, the printed config.toml in Codex's home.
The scripted policy makes Codex run shell commands through its exec tool (one writes a file),
spawn a sub-agent through its multi-agent tools and wait; a resumed session with a low
auto-compaction limit compacts and continues. The files appear; the stored tree has the main
agent, the sub-agent linked to its spawning call, the compaction, tool outputs as harness
tokens, and every main request before the compaction extends its predecessor's context;
`gyre trees stats` shows the classes.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from gyre_proxy.harness import CodexHarness
from gyre_store.catalog import Provenance
from tests.acceptance.conftest import ROOT, gyre
from tests.acceptance.processes import engine_and_proxy, settled_records, tree
from tests.real_servers import harness_binary

SPAWN_MESSAGE = "List the files in the workspace and report."


def codex_binary() -> str:
    return harness_binary("codex", ROOT / "tools/install_codex.sh")


def call(name: str, args: dict[str, object]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def script() -> dict[str, object]:
    # Checked in order against the whole prompt: the latest situation first. Markers are printed
    # by the commands (STEP$((1+1)) prints STEP2), so a command's own text never matches them.
    return {
        "rule": "match",
        "outputs": [
            {"when": "CONTEXT CHECKPOINT COMPACTION", "text": "Summary: a.txt and b.txt exist; a sub-agent listed them."},
            {"when": "Finish up.", "text": "Finished."},
            {"when": "SUB2DONE", "text": "Files: a.txt and b.txt."},
            {"when": SPAWN_MESSAGE + "<|im_end|>", "text": call("exec_command", {"cmd": "ls; echo SUB$((1+1))DONE"})},
            {"when": "WAITED2", "text": "The sub-agent is checking."},
            {"when": '"nickname":"', "text": call("exec_command", {"cmd": "sleep 3; echo WAITED$((1+1))"})},
            {"when": "STEP2", "text": call("multi_agent_v1.spawn_agent", {"message": SPAWN_MESSAGE})},
            {"when": "STEP1", "text": call("exec_command", {"cmd": "printf 'written by the policy\\n' > b.txt; echo STEP$((1+1))"})},
            {"when": "Create a.txt", "text": "I will create a file.\n" + call("exec_command", {"cmd": "echo hello > a.txt; echo STEP$((0+1))"})},
            {"when": "", "text": "OK."},
        ],
    }  # fmt: skip


@pytest.mark.timeout(900)
def test_codex_runs_through_the_proxy_and_its_tree_is_stored(tmp_path: Path, fresh_database_url: str) -> None:
    codex = codex_binary()
    workspace, home = tmp_path / "ws", tmp_path / "codex-home"
    workspace.mkdir()
    home.mkdir()
    (tmp_path / "script.json").write_text(json.dumps(script()))
    db = {"GYRE_DATABASE_URL": fresh_database_url}
    with engine_and_proxy(fresh_database_url, tmp_path / "script.json", "codex", tmp_path) as proxy:
        registered = gyre(
            "executions", "new", "--json", "--harness", "codex", "--run-id", "cx", "--execution-id", "cx-1",
            "--proxy-url", proxy, env=db,
        )  # fmt: skip
        assert registered.returncode == 0, registered.stderr
        execution = json.loads(registered.stdout)
        assert execution["base_url"] == proxy + "/v1"
        (home / "config.toml").write_text('model = "gyre-policy"\n' + execution["config_toml"])
        env = {**os.environ, "CODEX_HOME": str(home), "HOME": str(home), "GYRE_API_KEY": execution["api_key"]}
        flags = ["--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox"]
        first = subprocess.run(
            [codex, "exec", *flags, "Create a.txt with the shell, b.txt too, then ask a sub-agent to check."],
            cwd=workspace, env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert first.returncode == 0, first.stderr[-3000:]
        assert "The sub-agent is checking." in first.stdout
        resumed = subprocess.run(
            [codex, "exec", "resume", "--last", *flags, "-c", "model_auto_compact_token_limit=2000", "Finish up."],
            cwd=workspace, env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert "Finished." in resumed.stdout
        records = settled_records(fresh_database_url, "cx-1")
        stats = gyre("trees", "stats", "--execution", "cx-1", "--json", env=db)

    assert (workspace / "a.txt").read_text() == "hello\n"
    assert (workspace / "b.txt").read_text() == "written by the policy\n"

    view = tree(fresh_database_url, "cx-1")
    ordered = sorted(view.records.values(), key=lambda r: r.seq)
    # The size the run config's check assumes for Codex's first request (within 20%).
    first = len(view.input_of(ordered[0].request_id)[0])
    assert 0.8 * CodexHarness.first_request_tokens <= first <= CodexHarness.first_request_tokens, first
    assert len(ordered) == len(records) >= 8
    mains = [r for r in ordered if r.agent_kind == "main"]
    subs = [r for r in ordered if r.agent_kind == "sub_agent"]
    spawn = next(e for e in records if e.agent_kind == "sub_agent")
    assert spawn.spawned_by is not None and spawn.spawned_by.startswith("toolu_")
    assert len(subs) >= 2 and {r.agent_id for r in subs} == {spawn.spawned_by}
    compactions = [r for r in mains if r.purpose == "compaction"]
    assert len(compactions) == 1
    before = mains[: mains.index(compactions[0])]
    assert len(before) >= 4
    for earlier, later in [*itertools.pairwise(before), *itertools.pairwise(subs)]:
        earlier_full = np.concatenate(
            [view.input_of(earlier.request_id)[0], view.output_of(earlier.request_id)[0]]
        )
        np.testing.assert_array_equal(view.input_of(later.request_id)[0][: len(earlier_full)], earlier_full)
    tool_tokens = np.concatenate([view.input_of(r.request_id)[1] for r in before[1:]])
    assert np.any(tool_tokens == Provenance.TOOL_RESULT)
    assert mains[-1].purpose == "turn"  # the session went on after the compaction

    assert stats.returncode == 0, stats.stderr
    (shown,) = json.loads(stats.stdout)
    assert shown["requests"] == len(records)
    assert {"main", "main_summary", "sub_agent"} <= set(shown["candidates_by_class"])
