"""The Codex plug-in: agents and purposes from the client_metadata Codex 0.171 sends (values
modelled on captured requests), the spawn link, the fallback without metadata, and launching."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gyre_proxy.chat import ChatRequest, Message, Role, TextBlock, ToolUseBlock
from gyre_proxy.exceptions import HarnessError
from gyre_proxy.harness import CodexHarness, Launch, plugin_for, provider_config
from gyre_store.catalog import AgentKind, CallPurpose
from gyre_store.trees import ExecutionContext

MAIN = "01a22f83-0abc-79c3-a0b4-0cdf97422346"
SUB = "01a22f83-5064-7621-a842-d04d0049311c"


def metadata(thread: str, *, kind: str = "turn", sub: bool = False) -> tuple[tuple[str, str], ...]:
    turn = {"thread_id": thread, "agent_name": "/root", "request_kind": kind,
            "thread_source": "subagent" if sub else "user"}  # fmt: skip
    meta = {"session_id": MAIN, "thread_id": thread, "x-codex-turn-metadata": json.dumps(turn)}
    if sub:
        meta |= {"x-openai-subagent": "collab_spawn", "x-codex-parent-thread-id": MAIN}
    return tuple(meta.items())


def request(*texts: str, meta: tuple[tuple[str, str], ...] = ()) -> ChatRequest:
    messages = tuple(Message(Role.USER, (TextBlock(t),)) for t in texts)
    return ChatRequest(system="You are Codex.", messages=messages, client_metadata=meta)


def test_main_sub_agent_and_compaction_from_client_metadata() -> None:
    harness = CodexHarness()
    ctx = ExecutionContext("ex")
    main = harness.classify(ctx, request("<env/>", "do it", meta=metadata(MAIN)), "sha-main")
    assert (main.agent_kind, main.agent_id, main.purpose) == (AgentKind.MAIN, "main", CallPurpose.TURN)
    spawn = ToolUseBlock("toolu_spawn", "multi_agent_v1.spawn_agent", '{"message": "  List the files. "}')
    harness.observe_output("ex", Message(Role.ASSISTANT, (spawn,)))
    ctx.first_system_sha = "sha-main"
    # the sub-agent's own instructions differ; its history opens with the spawn message
    sub = harness.classify(ctx, request("<env/>", "List the files.", meta=metadata(SUB, sub=True)), "sha-sub")
    assert sub.agent_kind is AgentKind.SUB_AGENT and sub.spawned_by == "toolu_spawn"
    assert sub.agent_id == "toolu_spawn"
    later = harness.classify(
        ctx, request("<env/>", "List the files.", "more", meta=metadata(SUB, sub=True)), "x"
    )
    assert later == sub
    compaction = harness.classify(
        ctx, request("<env/>", "do it", meta=metadata(MAIN, kind="compaction")), "y"
    )
    assert compaction.agent_kind is AgentKind.MAIN and compaction.purpose is CallPurpose.COMPACTION


def test_an_unlinked_sub_agent_keeps_its_thread_as_its_id_and_links_once_seen() -> None:
    harness = CodexHarness()
    ctx = ExecutionContext("ex")
    first = harness.classify(ctx, request("Check.", meta=metadata(SUB, sub=True)), "s")
    assert first.agent_id == f"sub-{SUB}" and first.spawned_by is None
    harness.observe_output(
        "ex",
        Message(
            Role.ASSISTANT, (ToolUseBlock("toolu_9", "multi_agent_v1.spawn_agent", '{"message": "Check."}'),)
        ),
    )
    assert harness.classify(ctx, request("Check.", meta=metadata(SUB, sub=True)), "s").spawned_by == "toolu_9"


def test_without_metadata_the_first_system_prompt_is_the_main_agent() -> None:
    harness = CodexHarness()
    ctx = ExecutionContext("ex")
    assert harness.classify(ctx, request("hi"), "aaa").agent_kind is AgentKind.MAIN
    ctx.first_system_sha = "aaa"
    other = harness.classify(ctx, request("hi"), "bbbbbbbbbb")
    assert other.agent_kind is AgentKind.SUB_AGENT and other.agent_id == "sub-bbbbbbbb"
    summary = harness.classify(
        ctx, request("You are performing a CONTEXT CHECKPOINT COMPACTION. Create a handoff"), "aaa"
    )
    assert summary.purpose is CallPurpose.COMPACTION


def test_launch_points_codex_at_the_proxy_with_the_execution_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    launch = Launch(
        tmp_path / "ws", tmp_path / "home", "Fix it.", "http://127.0.0.1:9/", "sk-1", "gyre-policy"
    )
    monkeypatch.setenv("GYRE_CODEX_BIN", "/opt/codex")
    spec = plugin_for("codex").launch_spec(launch)
    assert spec.argv[:2] == ("/opt/codex", "exec") and spec.argv[-1] == "Fix it."
    assert (
        'model_providers.gyre={name="gyre", base_url="http://127.0.0.1:9/v1", wire_api="responses", env_key="GYRE_API_KEY"}'
        in spec.argv
    )
    assert spec.env == {
        "CODEX_HOME": str(tmp_path / "home"),
        "HOME": str(tmp_path / "home"),
        "GYRE_API_KEY": "sk-1",
    }
    monkeypatch.delenv("GYRE_CODEX_BIN")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(HarnessError, match=r"install_codex\.sh"):
        plugin_for("codex").launch_spec(launch)


def test_provider_config_is_toml_codex_reads() -> None:
    import tomllib

    config = tomllib.loads(provider_config("http://127.0.0.1:8080"))
    assert config["model_provider"] == "gyre"
    assert config["model_providers"]["gyre"] == {
        "name": "gyre", "base_url": "http://127.0.0.1:8080/v1", "wire_api": "responses", "env_key": "GYRE_API_KEY"
    }  # fmt: skip
