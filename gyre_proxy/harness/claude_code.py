"""Claude Code as a harness: its request conventions, and how to start the pinned CLI.

The main agent owns the first system prompt seen in the execution; any other system prompt is
a sub-agent started by an Agent (Task) tool call, matched by its prompt; a request whose last
user message asks for a summary is a compaction. The CLI runs non-interactively with its own
HOME, telemetry off, pointed at the proxy with the execution's key.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field

import msgspec

from gyre_proxy.chat import ChatRequest, Message, Role, TextBlock, ToolUseBlock
from gyre_proxy.exceptions import HarnessError
from gyre_proxy.harness.plugin import CallTraits, Launch, LaunchSpec
from gyre_store.catalog import AgentKind, CallPurpose
from gyre_store.trees import ExecutionContext

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
    # Claude Code 2.1.332's first request with the bundled Qwen3.6 vocabulary: 11,737 tokens
    # (tests/acceptance/test_claude_code.py checks it stays within 20% below this).
    first_request_tokens: int = 12_000
    _spawns: dict[str, dict[str, str]] = field(default_factory=dict)  # execution -> prompt -> tool_use id

    def classify(self, ctx: ExecutionContext, request: ChatRequest, system_sha: str) -> CallTraits:
        purpose = (
            CallPurpose.COMPACTION
            if COMPACTION.search(_last_user_text(request.messages))
            else CallPurpose.TURN
        )
        if ctx.first_system_sha is None or ctx.first_system_sha == system_sha:
            return CallTraits(AgentKind.MAIN, "main", purpose)
        spawned_by = self._spawned_by(ctx.execution_id, request)
        agent_id = spawned_by or f"sub-{system_sha[:8]}"
        return CallTraits(AgentKind.SUB_AGENT, agent_id, purpose, spawned_by)

    def _spawned_by(self, execution_id: str, request: ChatRequest) -> str | None:
        """The Agent call whose prompt opens the sub-agent's history: its first user message,
        or one text block of it (Claude Code puts a system reminder block before the prompt)."""
        first_user = next((m for m in request.messages if m.role == Role.USER), None)
        if first_user is None:
            return None
        spawns = self._spawns.get(execution_id, {})
        texts = [first_user.text(), *(b.text for b in first_user.blocks if isinstance(b, TextBlock))]
        return next((spawns[t.strip()] for t in texts if t.strip() in spawns), None)

    def observe_output(self, execution_id: str, assistant: Message) -> None:
        for b in assistant.blocks:
            if isinstance(b, ToolUseBlock) and b.name in AGENT_TOOLS:
                try:
                    args = msgspec.json.decode(b.input_json)
                except msgspec.DecodeError:
                    continue
                if isinstance(args, dict) and isinstance(args.get("prompt"), str):
                    self._spawns.setdefault(execution_id, {})[args["prompt"].strip()] = b.id

    def launch_spec(self, launch: Launch) -> LaunchSpec:
        binary = os.environ.get("GYRE_CLAUDE_BIN") or shutil.which("claude")
        if not binary:
            raise HarnessError(
                "Claude Code is not installed: run tools/install_claude_code.sh and set GYRE_CLAUDE_BIN "
                "to the path it prints (or put `claude` on PATH)"
            )
        env = {
            "ANTHROPIC_BASE_URL": launch.base_url,
            "ANTHROPIC_API_KEY": launch.api_key,
            "HOME": str(launch.home),
            "DISABLE_TELEMETRY": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "IS_SANDBOX": "1",  # as root it refuses to skip permissions otherwise
        }
        argv = (binary, "-p", launch.prompt, "--dangerously-skip-permissions", "--model", launch.model)
        return LaunchSpec(argv, env)
