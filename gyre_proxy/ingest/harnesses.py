"""Per-harness plug-ins that tell, from a request itself, whose call it is and what for.

A plug-in decides the agent (the main agent or a sub-agent, with the Agent tool call
that spawned it) and the purpose (a task turn or a compaction) of each model call; the
trajectory tree turns that into the leaf classes main > main-summary > sub-agent >
sub-agent-summary. Unknown harnesses get ``GenericHarness``: the tree then falls back to
"the first context root is the main agent".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Protocol

import msgspec

from gyre_proxy.chat import ChatRequest, Message, Role, TextBlock, ToolUseBlock
from gyre_store.catalog import AgentKind, CallPurpose
from gyre_store.trees import ExecutionContext


@dataclass(frozen=True, slots=True)
class CallTraits:
    agent_kind: AgentKind
    agent_id: str
    purpose: CallPurpose
    spawned_by: str | None = None


class HarnessPlugin(Protocol):
    name: str

    def classify(self, ctx: ExecutionContext, request: ChatRequest, system_sha: str) -> CallTraits: ...

    def observe_output(self, execution_id: str, assistant: Message) -> None: ...


class GenericHarness:
    """No knowledge of the harness: everything is a turn of an unknown agent."""

    name = "generic"

    def classify(self, ctx: ExecutionContext, request: ChatRequest, system_sha: str) -> CallTraits:
        return CallTraits(AgentKind.UNKNOWN, system_sha, CallPurpose.TURN)

    def observe_output(self, execution_id: str, assistant: Message) -> None:
        return None


# Claude Code's /compact (and auto-compaction) request ends with a user message asking for
# a detailed summary wrapped in <summary> tags.
COMPACTION = re.compile(
    r"detailed summary of the conversation|<summary>|summarize (this|the) conversation", re.I
)
AGENT_TOOLS = frozenset({"Task", "Agent"})


def _last_user_text(messages: tuple[Message, ...]) -> str:
    for m in reversed(messages):
        if m.role == Role.USER:
            return "".join(b.text for b in m.blocks if isinstance(b, TextBlock))
    return ""


@dataclass
class ClaudeCodeHarness:
    """Claude Code: the main agent owns the first system prompt seen in the execution;
    any other system prompt is a sub-agent started by an Agent (Task) tool call, matched by
    its prompt; a request whose last user message asks for the summary is a compaction."""

    name: str = "claude-code"
    _spawns: dict[str, dict[str, str]] = field(default_factory=dict)  # execution -> prompt -> tool_use id

    def classify(self, ctx: ExecutionContext, request: ChatRequest, system_sha: str) -> CallTraits:
        purpose = (
            CallPurpose.COMPACTION
            if COMPACTION.search(_last_user_text(request.messages))
            else CallPurpose.TURN
        )
        if ctx.first_system_sha is None or ctx.first_system_sha == system_sha:
            return CallTraits(AgentKind.MAIN, "main", purpose)
        first_user = next((m for m in request.messages if m.role == Role.USER), None)
        prompt = first_user.text() if first_user is not None else ""
        spawned_by = self._spawns.get(ctx.execution_id, {}).get(prompt.strip())
        agent_id = spawned_by or f"sub-{system_sha[:8]}"
        return CallTraits(AgentKind.SUB_AGENT, agent_id, purpose, spawned_by)

    def observe_output(self, execution_id: str, assistant: Message) -> None:
        for b in assistant.blocks:
            if isinstance(b, ToolUseBlock) and b.name in AGENT_TOOLS:
                try:
                    args = msgspec.json.decode(b.input_json)
                except msgspec.DecodeError:
                    continue
                if isinstance(args, dict) and isinstance(args.get("prompt"), str):
                    self._spawns.setdefault(execution_id, {})[args["prompt"].strip()] = b.id


def plugin_for(harness: str) -> HarnessPlugin:
    if harness in ("claude-code", "claude_code"):
        return ClaudeCodeHarness()
    return GenericHarness()
