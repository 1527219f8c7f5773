"""What a harness plug-in is: it tells, from a request itself, whose call it is and what for,
and it says how to start the harness for one execution.

Classification decides the agent (the main agent or a sub-agent, with the tool call that
spawned it) and the purpose (a task turn or a compaction) of each model call; the trajectory
tree turns that into the leaf classes main > main-summary > sub-agent > sub-agent-summary.
Launching is a command line and an environment pointing the harness at the proxy with the
execution's own key. An unknown harness gets ``GenericHarness``: the tree then falls back to
"the first context root is the main agent", and it cannot be launched.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from gyre_proxy.chat import ChatRequest, Message
from gyre_proxy.exceptions import HarnessError
from gyre_store.catalog import AgentKind, CallPurpose
from gyre_store.trees import ExecutionContext


@dataclass(frozen=True, slots=True)
class CallTraits:
    agent_kind: AgentKind
    agent_id: str
    purpose: CallPurpose
    spawned_by: str | None = None


@dataclass(frozen=True, slots=True)
class Launch:
    """One execution's harness, as the launcher sees it: where to point it and what to do."""

    workspace: Path  # the agent's working directory
    home: Path  # a private HOME for the harness's own state
    prompt: str
    base_url: str  # the proxy, as the harness's API base URL
    api_key: str  # the execution's own key: every call it makes lands in this execution
    model: str


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """The process to start for one execution: argv, extra environment, and stdin text.

    ``entry`` (module, function) says that ``argv`` is ``python -m <module> ...`` and that
    ``<function>(argv[3:])`` is the same program, so a launcher may fork it ready-imported;
    ``preload`` names further modules the program imports (lazily, say), imported once in the
    server it forks from."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    stdin: str = ""
    entry: tuple[str, str] | None = None
    preload: tuple[str, ...] = ()


class HarnessPlugin(Protocol):
    name: str
    # About how many tokens the harness's first request takes (its system prompt and tool
    # definitions), measured with the Qwen vocabularies; 0 where none is known. A run whose
    # model.max_context cannot hold it plus one answer is refused before it starts.
    first_request_tokens: int

    def classify(self, ctx: ExecutionContext, request: ChatRequest, system_sha: str) -> CallTraits: ...

    def observe_output(self, execution_id: str, assistant: Message) -> None: ...

    def launch_spec(self, launch: Launch) -> LaunchSpec:
        """The command that runs this harness for one execution; raises HarnessError if it cannot."""
        ...


class GenericHarness:
    """No knowledge of the harness: everything is a turn of an unknown agent."""

    name = "generic"
    first_request_tokens = 0  # any client: nothing is known of its requests

    def classify(self, ctx: ExecutionContext, request: ChatRequest, system_sha: str) -> CallTraits:
        return CallTraits(AgentKind.UNKNOWN, system_sha, CallPurpose.TURN)

    def observe_output(self, execution_id: str, assistant: Message) -> None:
        return None

    def launch_spec(self, launch: Launch) -> LaunchSpec:
        raise HarnessError("the generic harness is any client you start yourself: gyre cannot launch it")
