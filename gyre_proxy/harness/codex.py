"""Codex as a harness: how its requests tell their agent and purpose, and how to start the CLI.

Codex (0.171) puts its thread in every request's ``client_metadata``: ``thread_id``, and a
JSON ``x-codex-turn-metadata`` whose ``request_kind`` is ``compaction`` for its compaction
request. A sub-agent spawned through the ``multi_agent_v1.spawn_agent`` tool runs in a thread
of its own, marked ``x-openai-subagent`` (``thread_source: subagent``); it is linked to the
spawning call by the message the call gave it, which opens the sub-agent's history. Requests
without that metadata (another client on the Responses API) fall back to the system prompt:
the first one seen is the main agent's. The CLI runs ``codex exec`` non-interactively with
its own CODEX_HOME, the proxy configured as a Responses model provider by ``-c`` overrides.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from typing import Any

import msgspec

from gyre_proxy.chat import ChatRequest, Message, Role, ToolUseBlock
from gyre_proxy.exceptions import HarnessError
from gyre_proxy.harness.plugin import CallTraits, Launch, LaunchSpec
from gyre_store.catalog import AgentKind, CallPurpose
from gyre_store.trees import ExecutionContext

PROVIDER = "gyre"
KEY_ENV = "GYRE_API_KEY"
# Codex's compaction prompt, for clients that send no request_kind.
COMPACTION = re.compile(r"CONTEXT CHECKPOINT COMPACTION|handoff summary for another LLM", re.I)
SPAWN_TOOLS = frozenset({"multi_agent_v1.spawn_agent", "multi_agent.spawn_agent", "spawn_agent"})


def turn_metadata(request: ChatRequest) -> dict[str, Any]:
    """``client_metadata`` with Codex's ``x-codex-turn-metadata`` JSON merged in (it wins)."""
    meta: dict[str, Any] = dict(request.client_metadata)
    raw = meta.get("x-codex-turn-metadata")
    if isinstance(raw, str):
        try:
            turn = msgspec.json.decode(raw)
        except msgspec.DecodeError:
            turn = None
        if isinstance(turn, dict):
            meta.update(turn)
    return meta


def _last_user_text(messages: tuple[Message, ...]) -> str:
    for m in reversed(messages):
        if m.role == Role.USER:
            return m.text()
    return ""


def provider_config(base_url: str) -> str:
    """The ``config.toml`` lines that make the proxy Codex's model provider."""
    return (
        f'model_provider = "{PROVIDER}"\n\n'
        f"[model_providers.{PROVIDER}]\n"
        f'name = "{PROVIDER}"\n'
        f'base_url = "{base_url.rstrip("/")}/v1"\n'
        'wire_api = "responses"\n'
        f'env_key = "{KEY_ENV}"\n'
    )


@dataclass
class CodexHarness:
    """Codex: threads from ``client_metadata``; a sub-agent's thread is linked to the
    ``spawn_agent`` call whose message opens it; ``request_kind: compaction`` is a compaction."""

    name: str = "codex"
    # Codex 0.171.0's first request with the bundled Qwen3.6 vocabulary: 8,783 tokens
    # (tests/acceptance/test_codex.py checks it stays within 20% below this).
    first_request_tokens: int = 9_000
    _spawns: dict[str, dict[str, str]] = field(default_factory=dict)  # execution -> message -> call id
    _agents: dict[tuple[str, str], tuple[str, str | None]] = field(default_factory=dict)

    def classify(self, ctx: ExecutionContext, request: ChatRequest, system_sha: str) -> CallTraits:
        meta = turn_metadata(request)
        compaction = meta.get("request_kind") == "compaction" or bool(
            COMPACTION.search(_last_user_text(request.messages))
        )
        purpose = CallPurpose.COMPACTION if compaction else CallPurpose.TURN
        thread = meta.get("thread_id")
        if not isinstance(thread, str) or not thread:
            if ctx.first_system_sha is None or ctx.first_system_sha == system_sha:
                return CallTraits(AgentKind.MAIN, "main", purpose)
            return CallTraits(AgentKind.SUB_AGENT, f"sub-{system_sha[:8]}", purpose)
        sub = (
            "x-openai-subagent" in meta
            or meta.get("thread_source") == "subagent"
            or bool(meta.get("parent_thread_id") or meta.get("x-codex-parent-thread-id"))
        )
        if not sub:
            return CallTraits(AgentKind.MAIN, "main", purpose)
        known = self._agents.get((ctx.execution_id, thread))
        if known is None or known[1] is None:
            spawned_by = self._spawned_by(ctx.execution_id, request)
            known = (spawned_by or f"sub-{thread}", spawned_by)
            self._agents[(ctx.execution_id, thread)] = known
        return CallTraits(AgentKind.SUB_AGENT, known[0], purpose, known[1])

    def _spawned_by(self, execution_id: str, request: ChatRequest) -> str | None:
        spawns = self._spawns.get(execution_id, {})
        for m in request.messages:
            if m.role == Role.USER and (call := spawns.get(m.text().strip())) is not None:
                return call
        return None

    def observe_output(self, execution_id: str, assistant: Message) -> None:
        for b in assistant.blocks:
            if isinstance(b, ToolUseBlock) and b.name in SPAWN_TOOLS:
                try:
                    args = msgspec.json.decode(b.input_json)
                except msgspec.DecodeError:
                    continue
                if isinstance(args, dict) and isinstance(args.get("message"), str):
                    self._spawns.setdefault(execution_id, {})[args["message"].strip()] = b.id

    def launch_spec(self, launch: Launch) -> LaunchSpec:
        binary = os.environ.get("GYRE_CODEX_BIN") or shutil.which("codex")
        if not binary:
            raise HarnessError(
                "Codex is not installed: run tools/install_codex.sh and set GYRE_CODEX_BIN to the path "
                "it prints (or put `codex` on PATH)"
            )
        provider = (
            f'{{name="{PROVIDER}", base_url="{launch.base_url.rstrip("/")}/v1", '
            f'wire_api="responses", env_key="{KEY_ENV}"}}'
        )
        argv = (
            binary, "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
            "-c", f'model="{launch.model}"', "-c", f'model_provider="{PROVIDER}"',
            "-c", f"model_providers.{PROVIDER}={provider}",
            launch.prompt,
        )  # fmt: skip
        env = {"CODEX_HOME": str(launch.home), "HOME": str(launch.home), KEY_ENV: launch.api_key}
        return LaunchSpec(argv, env)
