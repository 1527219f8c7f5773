"""Synthetic executions shaped like real Claude Code runs, recorded as the proxy records them.

A scripted "harness" keeps a Claude Code-like message history (a long system prompt with
a dozen tools, tool calls and results, thinking, re-serialized tool inputs), compacts
when the context passes a threshold, delegates to sub-agents through the Agent tool
(some compacting on their own), retries a few requests after an aborted attempt and has
one interrupted tool call. Every request goes through ``Ingestor``: only new messages are
tokenized and every record lands in the trajectory tree. Seeded and reproducible.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from gyre_proxy.chat import (
    ChatRequest,
    Message,
    Role,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolSpec,
    ToolUseBlock,
)
from gyre_proxy.ingest.ingestor import Ingestor, Prepared
from gyre_store.catalog import CallFinish

WORDS = (  # noqa: SIM905 - reads better as prose
    "def return self import from class if else for while in not and or None True False try except raise with as "
    "yield lambda pass break continue async await print len range list dict set tuple str int float bytes open "
    "path file test assert value result error config data model request response token batch step loss grad "
    "engine cell core event stream store query group execution trajectory tree node leaf root prefix record "
    "src tests README main utils parser server client handler build make install run check fix update add "
    "= == != <= >= + - * / ( ) [ ] { } : , . -> # ' \""
).split()

MAIN_SYSTEM = (
    "You are Claude Code, an interactive command line tool that helps users with software engineering tasks. "
    "Use the instructions below and the tools available to you to assist the user.\n"
)
SUB_SYSTEM = (
    "You are an agent for Claude Code. Given the user's message, use the tools available to complete the task. "
    "Do what has been asked; nothing more, nothing less. When you complete the task respond with a detailed writeup.\n"
)
TOOL_NAMES = (
    "Bash",
    "Read",
    "Write",
    "Edit",
    "Glob",
    "Grep",
    "LS",
    "TodoWrite",
    "WebFetch",
    "NotebookEdit",
    "Task",
    "ExitPlanMode",
)
COMPACT_PROMPT = (
    "Your task is to create a detailed summary of the conversation so far, paying close attention to the user's "
    "explicit requests and your previous actions. Wrap your analysis in <analysis> tags and your summary in "
    "<summary> tags."
)
CONTINUATION = (
    "This session is being continued from a previous conversation that ran out of context. "
    "The conversation is summarized below:\n"
)
INTERRUPTED = "[Request interrupted by user for tool use]"


@dataclass(frozen=True, slots=True)
class TraceConfig:
    """How big and how branchy a synthetic execution is."""

    seed: int = 0
    main_requests: int = 420
    compact_at: int = 100_000  # tokens of context that trigger a main-agent compaction
    subagents: int = 4
    subagent_requests: tuple[int, int] = (12, 60)
    subagent_compact_at: int = 40_000
    retry_every: int = 97  # one retried request every this many
    tool_result_words: tuple[int, int] = (60, 1600)
    interrupt_at: int = 57


@dataclass
class _Agent:
    system: str
    tools: tuple[ToolSpec, ...]
    history: list[Message] = field(default_factory=list)
    context_tokens: int = 0


class TraceGenerator:
    """Drives one synthetic execution through an ``Ingestor``."""

    def __init__(
        self, ingestor: Ingestor, config: TraceConfig, *, progress: Callable[[int], None] | None = None
    ):
        self.ing = ingestor
        self.cfg = config
        self.rng = np.random.default_rng(config.seed)
        self.words = np.array(WORDS)
        self.tools = tuple(
            ToolSpec(
                name=n,
                description=self.text(40),
                input_schema_json=json.dumps({"type": "object", "properties": {"arg": {"type": "string"}}}),
            )
            for n in TOOL_NAMES
        )
        self.sub_system = SUB_SYSTEM + self.text(300)  # one sub-agent type: its runs share a root
        self.requests = 0
        self.tokenized = 0
        self.new_tokens = 0
        self._progress = progress
        self._tool_ids = 0

    def text(self, n_words: int) -> str:
        picks = self.words[self.rng.integers(0, len(self.words), n_words)]
        lines = [" ".join(picks[i : i + 12]) for i in range(0, n_words, 12)]
        return "\n".join(lines)

    def _tool_id(self) -> str:
        self._tool_ids += 1
        return f"toolu_{self.cfg.seed:04d}{self._tool_ids:08d}"

    # -- one model call ------------------------------------------------------------------------
    def call(self, ex: str, run: str, agent: _Agent, answer: Message, *, thinking: bool = True) -> None:
        request = ChatRequest(
            system=agent.system, messages=tuple(agent.history), tools=agent.tools, thinking=thinking
        )
        retry_of = None
        if self.requests and self.requests % self.cfg.retry_every == 0:
            # The first attempt is aborted mid-answer and sent again.
            prepared = self.ing.prepare(ex, run, request)
            partial = self.ing.template.render_output(answer).ids[:7]
            retry_of = self._record(prepared, partial, None, CallFinish.ABORT)
        prepared = self.ing.prepare(ex, run, request)
        out = self.ing.template.render_output(answer)
        self._record(prepared, out.ids, answer, CallFinish.STOP, retry_of=retry_of)
        agent.context_tokens = prepared.encoded.input_len + len(out)

    def _record(
        self,
        prepared: Prepared,
        ids: list[int],
        answer: Message | None,
        finish: CallFinish,
        retry_of: str | None = None,
    ) -> str:
        request_id = f"req-{self.requests:05d}"
        self.requests += 1
        self.tokenized += prepared.encoded.tokenized
        self.new_tokens += int(prepared.encoded.new_ids.shape[0])
        logprobs = -self.rng.exponential(0.4, len(ids)).astype(np.float32)
        self.ing.record(
            prepared,
            request_id=request_id,
            output_ids=np.asarray(ids, dtype=np.int32),
            output_logprobs=logprobs,
            assistant=answer,
            finish=finish,
            engine="synthetic",
            weight_versions=((0, 0),),
            retry_of=retry_of,
        )
        if self._progress is not None:
            self._progress(self.requests)
        return request_id

    # -- conversation pieces -------------------------------------------------------------------
    def tool_turn(self, name: str | None = None) -> tuple[Message, ToolUseBlock]:
        name = name or str(self.rng.choice([n for n in TOOL_NAMES if n not in ("Task", "ExitPlanMode")]))
        args = {"arg": self.text(int(self.rng.integers(3, 30))), "n": int(self.rng.integers(0, 100))}
        use = ToolUseBlock(id=self._tool_id(), name=name, input_json=json.dumps(args, separators=(",", ":")))
        blocks = (
            ThinkingBlock(self.text(int(self.rng.integers(10, 80)))),
            TextBlock(self.text(int(self.rng.integers(5, 40)))),
            use,
        )
        return Message(Role.ASSISTANT, blocks), use

    @staticmethod
    def harness_copy(message: Message) -> Message:
        """The assistant message as the harness sends it back: tool input re-serialized."""
        blocks = tuple(
            ToolUseBlock(b.id, b.name, json.dumps(json.loads(b.input_json), indent=1, sort_keys=True))
            if isinstance(b, ToolUseBlock)
            else b
            for b in message.blocks
        )
        return Message(Role.ASSISTANT, blocks)

    def result(self, use: ToolUseBlock, content: str | None = None, *, error: bool = False) -> Message:
        lo, hi = self.cfg.tool_result_words
        body = content if content is not None else self.text(int(self.rng.integers(lo, hi)))
        return Message(Role.USER, (ToolResultBlock(use.id, body, error),))

    def compact(self, ex: str, run: str, agent: _Agent, task: str) -> None:
        agent.history.append(Message(Role.USER, (TextBlock(COMPACT_PROMPT),)))
        summary = self.text(int(self.rng.integers(300, 900)))
        answer = Message(
            Role.ASSISTANT,
            (TextBlock(f"<analysis>\n{self.text(120)}\n</analysis>\n<summary>\n{summary}\n</summary>"),),
        )
        self.call(ex, run, agent, answer, thinking=False)
        agent.history = [
            Message(Role.USER, (TextBlock(CONTINUATION + summary + "\n\nOriginal task: " + task),))
        ]

    def subagent(self, ex: str, run: str, prompt: str, turns: int) -> str:
        agent = _Agent(self.sub_system, self.tools[:6], [Message(Role.USER, (TextBlock(prompt),))])
        for _ in range(turns):
            answer, use = self.tool_turn()
            self.call(ex, run, agent, answer)
            agent.history += [self.harness_copy(answer), self.result(use)]
            if agent.context_tokens > self.cfg.subagent_compact_at:
                self.compact(ex, run, agent, prompt)
        final = Message(Role.ASSISTANT, (TextBlock("Done. " + self.text(200)),))
        self.call(ex, run, agent, final)
        return final.text()

    def run(self, execution_id: str, run_id: str) -> None:
        cfg = self.cfg
        task = "Build the repository described below.\n" + self.text(400)
        main = _Agent(MAIN_SYSTEM + self.text(2500), self.tools, [Message(Role.USER, (TextBlock(task),))])
        spawn_at = (
            set(np.linspace(20, cfg.main_requests - 20, cfg.subagents).astype(int).tolist())
            if cfg.subagents
            else set()
        )
        step = 0
        while step < cfg.main_requests:
            if step in spawn_at:
                prompt = "Investigate and implement: " + self.text(60)
                answer, use = self.tool_turn("Task")
                use = ToolUseBlock(
                    use.id,
                    "Task",
                    json.dumps(
                        {"description": "sub-task", "prompt": prompt, "subagent_type": "general-purpose"}
                    ),
                )
                answer = Message(Role.ASSISTANT, (*answer.blocks[:2], use))
                self.call(execution_id, run_id, main, answer)
                lo, hi = cfg.subagent_requests
                result = self.subagent(execution_id, run_id, prompt, int(self.rng.integers(lo, hi)))
                main.history += [self.harness_copy(answer), self.result(use, result)]
            else:
                answer, use = self.tool_turn()
                self.call(execution_id, run_id, main, answer)
                if step == cfg.interrupt_at:
                    interrupted = Message(
                        Role.USER,
                        (
                            ToolResultBlock(use.id, INTERRUPTED, True),
                            TextBlock("Stop. Use a simpler approach."),
                        ),
                    )
                    main.history += [self.harness_copy(answer), interrupted]
                else:
                    main.history += [self.harness_copy(answer), self.result(use)]
            step += 1
            if main.context_tokens > cfg.compact_at:
                self.compact(execution_id, run_id, main, task)
        self.call(
            execution_id,
            run_id,
            main,
            Message(Role.ASSISTANT, (TextBlock("The repository is complete. " + self.text(100)),)),
        )
