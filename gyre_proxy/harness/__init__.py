"""Harness plug-ins: how gyre tells, from a request alone, which agent made a model call and
why (classification into the four trajectory classes), and how to start one execution of the
harness against the proxy. Claude Code, the built-in agent (``harness.agent``, an agent loop
on the ``anthropic`` SDK) and a generic fallback. A harness is never modified: the plug-in
only reads its requests and starts its process.
"""

from __future__ import annotations

from gyre_proxy import exceptions
from gyre_proxy.exceptions import HarnessError
from gyre_proxy.harness.agent import COMPACT_REQUEST, RESUME, SYSTEM_MAIN, SYSTEM_SUB, TOOL_SPECS
from gyre_proxy.harness.builtin import BuiltinHarness
from gyre_proxy.harness.claude_code import AGENT_TOOLS, COMPACTION, ClaudeCodeHarness
from gyre_proxy.harness.codex import KEY_ENV as CODEX_KEY_ENV
from gyre_proxy.harness.codex import CodexHarness, provider_config
from gyre_proxy.harness.plugin import CallTraits, GenericHarness, HarnessPlugin, Launch, LaunchSpec

HARNESSES: dict[str, type[HarnessPlugin]] = {
    "builtin": BuiltinHarness,
    "claude-code": ClaudeCodeHarness,
    "codex": CodexHarness,
    "generic": GenericHarness,
}
"""Harness names accepted by ``--harness`` and run configs, and their plug-ins."""


def plugin_for(name: str) -> HarnessPlugin:
    """A fresh plug-in for harness ``name``; raises HarnessError for an unknown one."""
    name = "claude-code" if name == "claude_code" else name
    try:
        return HARNESSES[name]()
    except KeyError:
        raise exceptions.HarnessError(
            f"unknown harness {name!r}; known: {', '.join(sorted(HARNESSES))}"
        ) from None


__all__ = [
    "AGENT_TOOLS",
    "CODEX_KEY_ENV",
    "COMPACTION",
    "COMPACT_REQUEST",
    "HARNESSES",
    "RESUME",
    "SYSTEM_MAIN",
    "SYSTEM_SUB",
    "TOOL_SPECS",
    "BuiltinHarness",
    "CallTraits",
    "ClaudeCodeHarness",
    "CodexHarness",
    "GenericHarness",
    "HarnessError",
    "HarnessPlugin",
    "Launch",
    "LaunchSpec",
    "plugin_for",
    "provider_config",
]
