"""The built-in agent harness: a small agent loop on the official ``anthropic`` SDK.

Run as ``python -m gyre_proxy.harness.agent --workspace DIR`` with the task on stdin and
``ANTHROPIC_BASE_URL`` / ``ANTHROPIC_API_KEY`` pointing at gyre's proxy. The model gets four
tools: Bash, Read and Write inside the workspace, and Agent, which runs a sub-agent (its own
system prompt and context, no Agent tool) and returns its report. When a context grows past
``--compact-after`` characters the harness asks the model for a summary and continues from
it, as Claude Code compacts. It follows Claude Code's conventions (an Agent tool with a
``prompt``, a compaction request asking for a detailed summary in ``<summary>`` tags), so the
proxy classifies its calls into the four trajectory classes the same way.

It is a harness, not a policy: it never looks at tokens, only at the Messages API, and it
knows nothing of gyre beyond the base URL and key. Exit status: 0 when the model finished
with a text answer, 3 when it ran out of turns, 4 when the API failed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SYSTEM_MAIN = "You are an agent in a workspace. Use the tools to do the task."
SYSTEM_SUB = "You are a sub-agent in a workspace. Use the tools to do the delegated task, then report."
COMPACT_REQUEST = (
    "Write a detailed summary of the conversation so far: the task, what was done, and what is "
    "left. Put it inside <summary></summary> tags."
)
RESUME = "This session continues from an earlier one. Summary of the earlier work:\n"
OUTPUT_LIMIT = 4000  # characters of a tool result shown to the model

TOOL_SPECS: dict[str, dict[str, Any]] = {
    "Bash": {
        "description": "Run a shell command.",
        "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
    "Read": {
        "description": "Read a file.",
        "input_schema": {
            "type": "object",
            "properties": {"file_path": {"type": "string"}},
            "required": ["file_path"],
        },
    },
    "Write": {
        "description": "Write a file.",
        "input_schema": {
            "type": "object",
            "properties": {"file_path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["file_path", "content"],
        },
    },
    "Agent": {
        "description": "Delegate a task to a sub-agent and get its report.",
        "input_schema": {
            "type": "object",
            "properties": {"prompt": {"type": "string"}},
            "required": ["prompt"],
        },
    },
}


@dataclass
class AgentConfig:
    model: str = "gyre-policy"
    max_turns: int = 4
    max_tokens: int = 160
    compact_after: int = 24_000  # characters of context before the harness compacts
    bash_timeout_s: float = 30.0
    temperature: float | None = None


@dataclass
class Workspace:
    """The folder the agent works in; every path the model names must stay inside it."""

    root: Path

    def path(self, name: str) -> Path:
        target = (self.root / name).resolve()
        if target != self.root and self.root not in target.parents:
            raise ValueError(f"{name}: outside the workspace")
        return target

    def read(self, name: str) -> str:
        target = self.path(name)
        if not target.is_file():
            raise ValueError(f"{name}: no such file")
        return target.read_text(errors="replace")[:OUTPUT_LIMIT]

    def write(self, name: str, content: str) -> str:
        target = self.path(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
        return "OK"

    def bash(self, command: str, timeout_s: float) -> str:
        try:
            done = subprocess.run(
                ["bash", "-c", command], cwd=self.root, capture_output=True, text=True, timeout=timeout_s
            )
        except subprocess.TimeoutExpired as exc:
            raise ValueError(f"timed out after {timeout_s} s") from exc
        out = (done.stdout + done.stderr)[-OUTPUT_LIMIT:]
        return out if done.returncode == 0 else f"{out}\n(exit {done.returncode})"


@dataclass
class Agent:
    """One agent's loop: a system prompt, its tools, its own context."""

    create: Callable[..., Any]  # client.messages.create
    workspace: Workspace
    config: AgentConfig
    system: str
    tools: tuple[str, ...]
    messages: list[dict[str, Any]] = field(default_factory=list)

    def run(self, task: str) -> str | None:
        """The agent's final answer to ``task``, or None when it ran out of turns.

        A tool call that cannot be carried out (a ValueError, a bad argument, an OS error)
        becomes an error result the model sees; the loop goes on."""
        self.messages = [{"role": "user", "content": task}]
        for _ in range(self.config.max_turns):
            if _size(self.messages) > self.config.compact_after:
                self._compact(task)
            reply = self._call(self.messages)
            content = [block.model_dump(exclude_none=True) for block in reply.content]
            self.messages.append({"role": "assistant", "content": content})
            uses = [b for b in content if b.get("type") == "tool_use"]
            if not uses:
                return "".join(b.get("text", "") for b in content if b.get("type") == "text")
            self.messages.append({"role": "user", "content": [self._tool_result(u) for u in uses]})
        return None

    def _call(self, messages: list[dict[str, Any]], tools: bool = True) -> Any:
        kwargs: dict[str, Any] = {}
        if self.config.temperature is not None:
            kwargs["temperature"] = self.config.temperature
        return self.create(
            model=self.config.model,
            max_tokens=self.config.max_tokens,
            system=self.system,
            tools=[{"name": n, **TOOL_SPECS[n]} for n in self.tools] if tools else [],
            messages=messages,
            **kwargs,
        )

    def _compact(self, task: str) -> None:
        reply = self._call([*self.messages, {"role": "user", "content": COMPACT_REQUEST}], tools=False)
        summary = "".join(getattr(b, "text", "") for b in reply.content)
        self.messages = [{"role": "user", "content": f"{task}\n\n{RESUME}{summary}"}]

    def _tool_result(self, use: dict[str, Any]) -> dict[str, Any]:
        args = use.get("input") or {}
        try:
            text = self._execute(use["name"], args)
            failed = False
        except (ValueError, KeyError, TypeError, OSError) as exc:
            text, failed = f"Error: {exc}", True
        result: dict[str, Any] = {"type": "tool_result", "tool_use_id": use["id"], "content": text}
        if failed:
            result["is_error"] = True
        return result

    def _execute(self, name: str, args: dict[str, Any]) -> str:
        if name not in self.tools:
            raise ValueError(f"no tool named {name}")
        if name == "Bash":
            return self.workspace.bash(str(args["command"]), self.config.bash_timeout_s)
        if name == "Read":
            return self.workspace.read(str(args["file_path"]))
        if name == "Write":
            return self.workspace.write(str(args["file_path"]), str(args["content"]))
        sub = Agent(self.create, self.workspace, self.config, SYSTEM_SUB, ("Bash", "Read", "Write"))
        report = sub.run(str(args["prompt"]))
        if report is None:
            raise ValueError(f"the sub-agent gave no report after {self.config.max_turns} turns")
        return report


def _size(messages: list[dict[str, Any]]) -> int:
    return len(json.dumps(messages))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gyre-agent", description=__doc__.splitlines()[0])
    parser.add_argument("--workspace", type=Path, required=True)
    parser.add_argument("--model", default=AgentConfig.model)
    parser.add_argument("--max-turns", type=int, default=AgentConfig.max_turns)
    parser.add_argument("--max-tokens", type=int, default=AgentConfig.max_tokens)
    parser.add_argument("--compact-after", type=int, default=AgentConfig.compact_after)
    parser.add_argument("--temperature", type=float, default=None)
    args = parser.parse_args(argv)
    import anthropic  # the SDK is the harness's own dependency, loaded only in its process

    task = sys.stdin.read()
    config = AgentConfig(
        args.model, args.max_turns, args.max_tokens, args.compact_after, temperature=args.temperature
    )
    client = anthropic.Anthropic(max_retries=2, timeout=600.0)
    agent = Agent(
        client.messages.create, Workspace(args.workspace.resolve()), config, SYSTEM_MAIN, tuple(TOOL_SPECS)
    )
    try:
        answer = agent.run(task)
    except anthropic.APIError as exc:
        print(f"the model API failed: {exc}", file=sys.stderr)
        return 4
    if answer is None:
        print(f"no final answer after {config.max_turns} turns", file=sys.stderr)
        return 3
    print(answer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
