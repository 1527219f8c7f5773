"""The built-in agent (``gyre_proxy.harness.agent``) as a harness plug-in.

It keeps Claude Code's request conventions, so its calls are classified by the same rules
(the first system prompt is the main agent, an Agent tool call spawns a sub-agent, a request
for a detailed summary is a compaction); it is launched as a Python process of its own.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from gyre_proxy.harness.claude_code import ClaudeCodeHarness
from gyre_proxy.harness.plugin import Launch, LaunchSpec


@dataclass
class BuiltinHarness(ClaudeCodeHarness):
    """The built-in agent: Bash, Read, Write and Agent tools, compaction past a context size."""

    name: str = "builtin"
    first_request_tokens: int = 0  # a short system prompt and four tools: any context holds it
    max_turns: int = 4
    max_tokens: int = 160
    compact_after: int = 24_000

    def launch_spec(self, launch: Launch) -> LaunchSpec:
        argv = (
            sys.executable,
            "-m",
            "gyre_proxy.harness.agent",
            "--workspace",
            str(launch.workspace),
            "--model",
            launch.model,
            "--max-turns",
            str(self.max_turns),
            "--max-tokens",
            str(self.max_tokens),
            "--compact-after",
            str(self.compact_after),
        )
        env = {
            "ANTHROPIC_BASE_URL": launch.base_url,
            "ANTHROPIC_API_KEY": launch.api_key,
            "HOME": str(launch.home),
        }
        # The SDK takes seconds of CPU to import, paid per execution unless the fork server has it.
        return LaunchSpec(
            argv, env, stdin=launch.prompt, entry=("gyre_proxy.harness.agent", "main"), preload=("anthropic",)
        )
