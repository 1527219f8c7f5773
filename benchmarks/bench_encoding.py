"""Incremental encoding against rendering and tokenizing the whole history, at 1K, 10K and 100K tokens.

The proxy encodes a request incrementally (``gyre_proxy/ingest/incremental.py``): its messages
are matched against the execution's stored tree by chain hash, and only the messages after
the stored prefix, and the generation prompt, are rendered and tokenized. This benchmark
measures that against the baseline of rendering and tokenizing the whole history from scratch,
for each chat format:

* ``demo``: gyre's ``Qwen3Template`` with the bundled Qwen3.6 vocabulary (the demo's default);
  the whole history is ``encode_request`` on an empty ``ExecutionContext``, which renders
  every message.
* ``qwen3``, ``qwen3.6``, ``llama3``: a tiny checkpoint of that family
  (``gyre_train.checkpoints.write_checkpoint``) loaded with ``load_chat_format`` (its own
  tokenizer and Jinja chat template, ``JinjaChatFormat``); the whole history is
  ``render_text(all messages, tools, add_generation_prompt=True)`` then the checkpoint
  tokenizer's ``encode_with_specials`` (what ``apply_chat_template(tokenize=True)`` does).

The execution is a synthetic coding-agent run: a system prompt, six tools like a coding
harness's (Bash, Read, Edit, Write, Grep, Glob), a first user task, then turns of assistant
reasoning and one tool call, each answered by a tool result (source files with line numbers,
test logs, directory listings, grep hits, diffs) of varied size. Every turn goes through an
``Ingestor`` over an ``InMemoryEventLog``: the request is prepared, the assistant's tokens
(``render_output``, as an engine would sample them) are recorded, and the next request
carries the answer and its tool result, as a harness sends it. When the next request reaches
a size (``--sizes``, tokens of input), the tool result that gets there is sized to land on
it, and both are timed on that request:

* incremental: ``Ingestor.prepare`` (match, render and tokenize the newest tool result and the
  generation prompt), the median of ``--repeats``;
* whole: the baseline above, the median of ``--repeats``.

Before timing, the benchmark checks that both give the same input: the stored prefix plus
the new ids equal the whole history's ids, token for token, so the two arms do the same work.
The assistant turns carry reasoning and the requests have thinking on, so every template
renders the earlier turns as they were sampled (Qwen3's template drops reasoning only before
the last user query, and writes an empty think block only in the last assistant turn; neither
happens here). Target, fixed before measuring: at 100K tokens, whole / incremental >= 20 for
every format, MET or MISSED. The plot goes to ``out/bench_encoding/encoding.png`` (not
committed); ``--profile`` prints where the incremental time goes (cProfile) at the largest size.

    .venv/bin/python benchmarks/bench_encoding.py [--quick] [--formats demo,qwen3,qwen3.6,llama3]
        [--sizes 1000,10000,100000] [--repeats 15] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from bars import bar
from rich.console import Console
from rich.table import Table

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
from gyre_proxy.engines import CheckpointTokenizer, qwen_tokenizer
from gyre_proxy.harness import GenericHarness
from gyre_proxy.ingest import (
    ChatFormat,
    Ingestor,
    JinjaChatFormat,
    Prepared,
    Qwen3Template,
    encode_request,
    load_chat_format,
)
from gyre_proxy.ingest.chat_template import tool_definition
from gyre_proxy.ingest.jinja_format import openai_messages
from gyre_store import InMemoryEventLog
from gyre_store.catalog import CallFinish
from gyre_store.trees import ExecutionContext, TrajectoryRecorder

ROOT = Path(__file__).resolve().parents[1]

FORMATS = ("demo", "qwen3", "qwen3.6", "llama3")
TARGET_SIZE = 100_000  # the size the target is read at
TARGET_RATIO = 20.0  # whole / incremental at TARGET_SIZE, at least (fixed before measuring)

# -- the synthetic execution --------------------------------------------------------------------

SYSTEM = (
    "You are a coding agent working in a git repository on the user's machine. Use the tools to "
    "read, search and change files and to run commands. Read a file before you edit it; keep "
    "changes small and in the style of the code around them; run the tests after a change and "
    "fix what fails. Never commit unless asked. Answer briefly and say what you changed."
)


def _schema(properties: dict[str, tuple[str, str]], required: list[str]) -> str:
    return json.dumps(
        {
            "type": "object",
            "properties": {k: {"type": t, "description": d} for k, (t, d) in properties.items()},
            "required": required,
        }
    )


TOOLS = (
    ToolSpec("Bash", "Run a shell command in the repository and return its output (stdout and stderr).",
             _schema({"command": ("string", "The command to run."),
                      "timeout": ("integer", "Seconds before the command is stopped (default 120).")},
                     ["command"])),
    ToolSpec("Read", "Read a file, with line numbers. Use offset and limit for a part of a long file.",
             _schema({"file_path": ("string", "The absolute path of the file."),
                      "offset": ("integer", "The first line to read."),
                      "limit": ("integer", "How many lines to read.")}, ["file_path"])),
    ToolSpec("Edit", "Replace exactly one occurrence of old_string with new_string in a file.",
             _schema({"file_path": ("string", "The absolute path of the file."),
                      "old_string": ("string", "The text to replace; it must occur once."),
                      "new_string": ("string", "The text to put in its place.")},
                     ["file_path", "old_string", "new_string"])),
    ToolSpec("Write", "Write a whole file, replacing it if it exists.",
             _schema({"file_path": ("string", "The absolute path of the file."),
                      "content": ("string", "The file's new content.")}, ["file_path", "content"])),
    ToolSpec("Grep", "Search file contents with a regular expression (ripgrep).",
             _schema({"pattern": ("string", "The regular expression."),
                      "path": ("string", "The folder or file to search (default: the repository)."),
                      "glob": ("string", "Only files whose names match this glob.")}, ["pattern"])),
    ToolSpec("Glob", "List files whose paths match a glob pattern, newest first.",
             _schema({"pattern": ("string", "The glob pattern, e.g. src/**/*.py.")}, ["pattern"])),
)  # fmt: skip

TASK = (
    "The CSV export in reports/export.py drops rows whose amount is negative, and the totals "
    "line is off by one cent for some inputs. Find out why, fix both, and add tests."
)

NAMES = ("amount", "row", "total", "currency", "rate", "report", "writer", "record", "line", "value",
         "account", "ledger", "period", "entry", "rounding", "decimal", "header", "fields", "buffer")  # fmt: skip
MODULES = ("reports/export.py", "reports/totals.py", "reports/format.py", "ledger/entries.py",
           "ledger/accounts.py", "tests/test_export.py", "tests/test_totals.py", "cli/main.py")  # fmt: skip


class Writer:
    """Realistic tool output and assistant turns, from a seeded generator."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def name(self) -> str:
        return "_".join(self.rng.sample(NAMES, self.rng.randint(1, 2)))

    def code_line(self, indent: int) -> str:
        r, a, b = self.rng.random(), self.name(), self.name()
        pad = "    " * indent
        if r < 0.15:
            return f"{pad}def {a}(self, {b}: Decimal, *, strict: bool = False) -> list[{b.title()}]:"
        if r < 0.3:
            return f"{pad}if {a} is None or {b} < 0:"
        if r < 0.45:
            return f"{pad}{a} = {b}.quantize(Decimal('0.01'), rounding=ROUND_HALF_UP)"
        if r < 0.55:
            return (
                f'{pad}"""Return the {a.replace("_", " ")} for each {b.replace("_", " ")} in the period."""'
            )
        if r < 0.65:
            return f"{pad}for {a} in sorted({b}s, key=lambda r: (r.date, r.id)):"
        if r < 0.75:
            return f"{pad}return [{a} for {a} in {b} if {a}.{self.name()} != 0]"
        if r < 0.85:
            return f"{pad}self.{a}.append({b}(row[{self.rng.randint(0, 9)}], self.{self.name()}))"
        return f'{pad}raise ValueError(f"bad {a}: {{{b}!r}} (expected {self.rng.randint(1, 99)})")'

    def source(self, tokens: int) -> str:
        """A file as Read returns it: numbered lines of Python."""
        lines: list[str] = []
        start, indent, size = self.rng.randint(1, 400), 0, 0
        while size < tokens * 4:
            indent = max(0, min(3, indent + self.rng.choice((-1, 0, 0, 1))))
            line = f"{start + len(lines):6d}\t{self.code_line(indent)}"
            lines.append(line)
            size += len(line) + 1
        return "\n".join(lines)

    def test_log(self, tokens: int) -> str:
        out = ["============================= test session starts ==============================",
               "platform linux -- Python 3.11.9, pytest-8.3.2, pluggy-1.5.0",
               f"collected {self.rng.randint(20, 300)} items", ""]  # fmt: skip
        size = 0
        while size < tokens * 4:
            module = self.rng.choice(MODULES)
            if self.rng.random() < 0.2:
                line = (f"FAILED {module}::test_{self.name()} - AssertionError: assert Decimal('"
                        f"{self.rng.randint(1, 9999)}.{self.rng.randint(0, 99):02d}') == Decimal('"
                        f"{self.rng.randint(1, 9999)}.{self.rng.randint(0, 99):02d}')")  # fmt: skip
            else:
                line = f"{module}::test_{self.name()} PASSED{' ' * self.rng.randint(1, 20)}[{self.rng.randint(1, 99):3d}%]"
            out.append(line)
            size += len(line) + 1
        out.append(
            f"========== {self.rng.randint(1, 5)} failed, {self.rng.randint(20, 300)} passed in 3.21s =========="
        )
        return "\n".join(out)

    def listing(self, tokens: int) -> str:
        out, size = [f"total {self.rng.randint(8, 400)}"], 0
        while size < tokens * 4:
            line = (f"-rw-r--r--  1 dev dev {self.rng.randint(100, 90000):6d} Mar {self.rng.randint(1, 28):2d} "
                    f"{self.rng.randint(0, 23):02d}:{self.rng.randint(0, 59):02d} {self.name()}.py")  # fmt: skip
            out.append(line)
            size += len(line) + 1
        return "\n".join(out)

    def grep(self, tokens: int) -> str:
        out, size = [], 0
        while size < tokens * 4:
            line = f"{self.rng.choice(MODULES)}:{self.rng.randint(1, 900)}:{self.code_line(1).strip()}"
            out.append(line)
            size += len(line) + 1
        return "\n".join(out)

    def diff(self, tokens: int) -> str:
        out, size = [f"diff --git a/{MODULES[0]} b/{MODULES[0]}", "index 3f2a1c0..8b9d4e2 100644",
                     f"--- a/{MODULES[0]}", f"+++ b/{MODULES[0]}"], 0  # fmt: skip
        while size < tokens * 4:
            hunk = f"@@ -{self.rng.randint(1, 400)},7 +{self.rng.randint(1, 400)},8 @@"
            lines = [hunk] + [
                self.rng.choice(" -+") + self.code_line(self.rng.randint(0, 2)) for _ in range(8)
            ]
            out.extend(lines)
            size += sum(len(x) + 1 for x in lines)
        return "\n".join(out)

    def tool_result(self, tool: str, tokens: int) -> str:
        if tool == "Read":
            return self.source(tokens)
        if tool == "Grep":
            return self.grep(tokens)
        if tool == "Glob":
            return self.listing(tokens)
        if tool in ("Edit", "Write"):
            return f"The file {self.rng.choice(MODULES)} has been updated.\n" + self.diff(max(0, tokens - 20))
        return self.rng.choice((self.test_log, self.listing, self.diff))(tokens)

    def turn(self, n: int) -> tuple[Message, str]:
        """An assistant turn (reasoning, a few words, one tool call) and the tool it calls."""
        tool = self.rng.choices(("Read", "Bash", "Grep", "Edit", "Glob", "Write"), (5, 4, 3, 3, 1, 1))[0]
        path = f"/repo/{self.rng.choice(MODULES)}"
        args: dict[str, Any]
        if tool == "Read":
            args = {"file_path": path, "offset": self.rng.randint(1, 300), "limit": 200}
        elif tool == "Bash":
            args = {"command": self.rng.choice(("python -m pytest -x -q tests/", "ls -la reports ledger",
                                                "git diff --stat", "git log --oneline -20"))}  # fmt: skip
        elif tool == "Grep":
            args = {"pattern": f"def {self.name()}|{self.name()}\\(", "glob": "*.py"}
        elif tool == "Glob":
            args = {"pattern": "**/*.py"}
        elif tool == "Edit":
            old = "\n".join(self.code_line(1) for _ in range(self.rng.randint(1, 6)))
            new = "\n".join(self.code_line(1) for _ in range(self.rng.randint(1, 8)))
            args = {"file_path": path, "old_string": old, "new_string": new}
        else:
            args = {"file_path": path, "content": self.source(self.rng.randint(50, 400))}
        thinking = " ".join(
            f"The {self.name().replace('_', ' ')} is computed before the {self.name().replace('_', ' ')}, "
            f"so {self.rng.choice(('rounding happens twice', 'negative rows are skipped', 'the header is counted'))}."
            for _ in range(self.rng.randint(1, 4))
        )
        words = self.rng.choice(("Let me look at that.", "Checking the tests next.", "I'll fix this now.",
                                 "Now the totals.", ""))  # fmt: skip
        blocks = (ThinkingBlock(thinking), *((TextBlock(words),) if words else ()),
                  ToolUseBlock(f"toolu_{n:04d}", tool, json.dumps(args)))  # fmt: skip
        return Message(Role.ASSISTANT, blocks), tool

    def result_tokens(self) -> int:
        """A tool result's size, log-uniform from a line to a long file (tokens, about)."""
        return int(np.exp(self.rng.uniform(np.log(20), np.log(3000))))


# -- the formats --------------------------------------------------------------------------------


@dataclass
class Format:
    name: str
    chat: ChatFormat
    whole: Callable[[ChatRequest], list[int]]  # the baseline: the whole history, from scratch
    decode: Callable[[list[int]], str]


def jinja_whole(fmt: JinjaChatFormat, tok: CheckpointTokenizer) -> Callable[[ChatRequest], list[int]]:
    def whole(request: ChatRequest) -> list[int]:
        messages = [{"role": "system", "content": request.system}] if request.system else []
        for m in request.messages:
            messages.extend(openai_messages(m))
        tools = [tool_definition(t) for t in request.tools]
        text = fmt.render_text(messages, tools, add_generation_prompt=True, thinking=request.thinking)
        return tok.encode_with_specials(text)

    return whole


def make_format(name: str, folder: Path) -> Format:
    if name == "demo":
        template = Qwen3Template(qwen_tokenizer())

        def demo_whole(request: ChatRequest) -> list[int]:
            ids: list[int] = encode_request(ExecutionContext("fresh"), template, request).new_ids.tolist()
            return ids

        return Format(name, template, demo_whole, template.tok.decode)
    from gyre_tools.checkpoint import default_cache_dir  # type: ignore[import-not-found]
    from gyre_train.checkpoints import write_checkpoint

    path = write_checkpoint(name, folder / name.replace(".", "_"), cache_dir=default_cache_dir())
    fmt = load_chat_format(path)
    assert isinstance(fmt.tok, CheckpointTokenizer)
    return Format(name, fmt, jinja_whole(fmt, fmt.tok), fmt.tok.decode)


# -- measuring ----------------------------------------------------------------------------------


@dataclass
class Row:
    format: str
    target: int
    tokens: int  # the request's input tokens
    messages: int
    new_tokens: int  # tokenized by the incremental path
    incremental_s: float
    whole_s: float

    @property
    def ratio(self) -> float:
        return self.whole_s / self.incremental_s


def medians_s(arms: list[Callable[[], object]], repeats: int) -> list[float]:
    """The median seconds of each arm; the arms alternate, so a change in the machine's load
    reaches all of them."""
    for arm in arms:
        arm()  # warm up (lazy loads, caches)
    times: list[list[float]] = [[] for _ in arms]
    for _ in range(repeats):
        for arm, seen in zip(arms, times, strict=True):
            began = time.perf_counter()
            arm()
            seen.append(time.perf_counter() - began)
    return [statistics.median(seen) for seen in times]


def grow(
    fmt: Format, sizes: list[int], seed: int
) -> Iterator[tuple[int, Ingestor, ChatRequest, dict[str, np.ndarray]]]:
    """Run the synthetic execution through an Ingestor; yield at each size the request that
    reaches it (with the ingestor holding every earlier turn, and every record's tokens)."""
    writer = Writer(seed)
    ingestor = Ingestor(TrajectoryRecorder(InMemoryEventLog()), fmt.chat, GenericHarness())
    sequences: dict[str, np.ndarray] = {}  # record -> its tokens (prefix, input, output)
    history: list[Message] = [Message(Role.USER, (TextBlock(TASK),))]
    pending = sorted(sizes)
    n = 0
    last_input = 0
    while pending:
        request = ChatRequest(system=SYSTEM, messages=tuple(history), tools=TOOLS, thinking=True)
        prepared = ingestor.prepare("ex", "run", request)
        size = prepared.encoded.input_len
        # Timed only with a stored history (the first request, whole, is never incremental).
        while pending and size >= pending[0] * 0.97 and prepared.encoded.prefix is not None:
            yield pending.pop(0), ingestor, request, sequences
        if not pending:
            return
        answer, tool = writer.turn(n)
        sampled = np.asarray(fmt.chat.render_output(answer).ids, np.int32)
        record(ingestor, prepared, f"r{n}", answer, sampled, sequences)
        # The next tool result: drawn, or sized to land on the next size.
        room = pending[0] - (size + len(sampled) + 40)
        want = writer.result_tokens()
        if room <= want * 1.3:
            want = max(10, room)
        use = next(b for b in answer.blocks if isinstance(b, ToolUseBlock))
        history += [answer, Message(Role.USER, (ToolResultBlock(use.id, writer.tool_result(tool, want)),))]
        n += 1
        if size <= last_input:
            raise RuntimeError("the history stopped growing")
        last_input = size


def record(ingestor: Ingestor, prepared: Prepared, rid: str, answer: Message, sampled: np.ndarray,
           sequences: dict[str, np.ndarray]) -> None:  # fmt: skip
    ingestor.record(prepared, request_id=rid, output_ids=sampled,
                    output_logprobs=np.full(len(sampled), -0.1, np.float32), assistant=answer,
                    finish=CallFinish.STOP)  # fmt: skip
    sequences[rid] = np.concatenate([input_ids(prepared, sequences), sampled])


def input_ids(prepared: Prepared, sequences: dict[str, np.ndarray]) -> np.ndarray:
    enc = prepared.encoded
    prefix = (
        sequences[enc.prefix.request_id][: enc.prefix_len]
        if enc.prefix is not None
        else np.zeros(0, np.int32)
    )
    return np.concatenate([prefix, enc.new_ids]).astype(np.int32)


def check_same_input(
    fmt: Format, prepared: Prepared, whole: list[int], sequences: dict[str, np.ndarray]
) -> None:
    """The incremental input (stored prefix + new ids) is the whole history's, token for token."""
    ids = input_ids(prepared, sequences).tolist()
    if ids == whole:
        return
    first = next(
        (i for i, (a, b) in enumerate(zip(ids, whole, strict=False)) if a != b), min(len(ids), len(whole))
    )
    raise AssertionError(
        f"{fmt.name}: the incremental input ({len(ids)} ids) differs from the whole history's ({len(whole)}) "
        f"at token {first}:\n  incremental ...{fmt.decode(ids[max(0, first - 20) : first + 30])!r}\n"
        f"  whole       ...{fmt.decode(whole[max(0, first - 20) : first + 30])!r}"
    )


# Where the incremental path's time goes: (label, file suffix, function), cumulative time.
PROFILE_PARTS = (
    ("match: chain hashes of every message", "chat/messages.py", "chain_hashes"),
    ("restore tool-call payloads", "ingest/payloads.py", "restore"),
    ("render: Jinja template runs", "ingest/jinja_format.py", "render_text"),
    ("  of which the tojson filter", "ingest/jinja_format.py", "_tojson"),
    ("render: scan harness text for added tokens", "ingest/jinja_format.py", "_spells_markup"),
    ("render: Qwen3Template messages", "ingest/chat_template.py", "render_message"),
    ("tokenize: encode_pieces", "engines/tokenizer.py", "encode_pieces"),
)


@dataclass
class Profile:
    calls: int
    total_s: float
    parts: list[tuple[str, int, float]]  # label, calls, cumulative seconds
    listing: str


def profile_incremental(ingestor: Ingestor, request: ChatRequest, repeats: int) -> Profile:
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(repeats):
        ingestor.prepare("ex", "run", request)
    profiler.disable()
    stats = pstats.Stats(profiler)
    table: dict[tuple[str, int, str], tuple[int, int, float, float, object]] = stats.stats  # type: ignore[attr-defined]
    parts: list[tuple[str, int, float]] = []
    total = 0.0
    for (file, _, function), (_, _, _, cumulative, _) in table.items():
        if file.endswith("ingest/ingestor.py") and function == "prepare":
            total = cumulative
    for label, suffix, name in PROFILE_PARTS:
        found = [(c, t) for (f, _, fn), (_, c, _, t, _) in table.items() if f.endswith(suffix) and fn == name]
        if found:
            parts.append((label, sum(c for c, _ in found), sum(t for _, t in found)))
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(20)
    return Profile(repeats, total, parts, out.getvalue())


# -- output -------------------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "[green]MET[/]" if ok else "[red]MISSED[/]"


def plot(path: Path, rows: list[Row]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, ax = plt.subplots(figsize=(7, 4.5))
    for i, name in enumerate(dict.fromkeys(r.format for r in rows)):
        mine = [r for r in rows if r.format == name]
        color = f"C{i}"
        ax.plot([r.tokens for r in mine], [r.incremental_s * 1e3 for r in mine], "o-", color=color,
                label=f"{name}: incremental")  # fmt: skip
        ax.plot([r.tokens for r in mine], [r.whole_s * 1e3 for r in mine], "s--", color=color,
                label=f"{name}: whole history")  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("history (input tokens)")
    ax.set_ylabel("ms to encode the request (median)")
    ax.set_title("Incremental encoding against the whole history")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="demo and qwen3 only, 5 repeats")
    parser.add_argument("--formats", help=f"comma-separated, of {', '.join(FORMATS)} (default: all)")
    parser.add_argument("--sizes", default="1000,10000,100000", help="input tokens, comma-separated")
    parser.add_argument("--repeats", type=int, help="timed runs of each arm (default 15, quick 5)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--profile", action="store_true", help="cProfile the incremental path at the largest size"
    )
    parser.add_argument("--verbose", action="store_true", help="with --profile: print the top functions too")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "bench_encoding")
    args = parser.parse_args()
    names = args.formats.split(",") if args.formats else (["demo", "qwen3"] if args.quick else list(FORMATS))
    if unknown := [n for n in names if n not in FORMATS]:
        parser.error(f"unknown formats {unknown}; of {', '.join(FORMATS)}")
    sizes = sorted(int(s) for s in args.sizes.split(","))
    repeats = args.repeats or (5 if args.quick else 15)
    console = Console(width=max(Console().width, 120))
    loads_before = os.getloadavg()
    rows: list[Row] = []
    profiles: dict[str, Profile] = {}
    with (
        tempfile.TemporaryDirectory(prefix="gyre-bench-encoding-") as tmp,
        bar(console) as progress,
    ):
        task = progress.add_task("formats x sizes", total=len(names) * len(sizes))
        for name in names:
            progress.update(task, description=f"{name}: loading")
            fmt = make_format(name, Path(tmp))
            progress.update(task, description=f"{name}: growing the execution")
            for target, ingestor, request, sequences in grow(fmt, sizes, args.seed):
                progress.update(task, description=f"{name} at {target:,} tokens: timing")
                prepared = ingestor.prepare("ex", "run", request)
                whole_ids = fmt.whole(request)
                check_same_input(fmt, prepared, whole_ids, sequences)
                incremental, whole = medians_s(
                    [lambda: ingestor.prepare("ex", "run", request), lambda: fmt.whole(request)],  # noqa: B023
                    repeats,
                )
                rows.append(Row(name, target, prepared.encoded.input_len, len(request.messages) + 1,
                                prepared.encoded.tokenized, incremental, whole))  # fmt: skip
                if args.profile and target == sizes[-1]:
                    profiles[name] = profile_incremental(ingestor, request, repeats)
                progress.advance(task)

    table = Table(
        title=f"Encoding the next request: incremental (Ingestor.prepare) against the whole history "
        f"(median of {repeats})",
        caption=f"target at {TARGET_SIZE:,} tokens: whole / incremental >= {TARGET_RATIO:.0f}x; the incremental "
        "input equals the whole history's ids, token for token, in every row",
    )
    for column in ("size", "format", "input tokens", "messages", "tokenized (incr.)", "incremental ms",
                   "whole ms", "ratio", f"target >= {TARGET_RATIO:.0f}x"):  # fmt: skip
        table.add_column(column, justify="right")
    met = missed = 0
    for r in rows:
        mark = "-"
        if r.target == TARGET_SIZE:
            ok = r.ratio >= TARGET_RATIO
            met, missed = met + ok, missed + (not ok)
            mark = verdict(ok)
        table.add_row(f"{r.target:,}", r.format, f"{r.tokens:,}", str(r.messages), f"{r.new_tokens:,}",
                      f"{r.incremental_s * 1e3:.2f}", f"{r.whole_s * 1e3:.2f}", f"{r.ratio:.1f}x", mark)  # fmt: skip
    console.print(table)
    if profiles:
        parts = Table(
            title=f"Where the incremental time goes at {sizes[-1]:,} tokens (cProfile, {repeats} calls; "
            "ms per request, cumulative, with the profiler's overhead)"
        )
        parts.add_column("part")
        for name in profiles:
            parts.add_column(name, justify="right")
        labels = list(dict.fromkeys(label for p in profiles.values() for label, _, _ in p.parts))
        parts.add_row(
            "Ingestor.prepare, all", *(f"{p.total_s / p.calls * 1e3:.1f}" for p in profiles.values())
        )
        for label in labels:
            cells = []
            for p in profiles.values():
                hit = next(((c, t) for lb, c, t in p.parts if lb == label), None)
                cells.append("-" if hit is None else
                             f"{hit[1] / p.calls * 1e3:.1f} ({hit[1] / p.total_s:.0%}, {hit[0] / p.calls:g} calls)")  # fmt: skip
            parts.add_row(label, *cells)
        console.print(parts)
        if args.verbose:
            for name, p in profiles.items():
                console.rule(f"cProfile: {name}, incremental at {sizes[-1]:,} tokens ({p.calls} calls)")
                console.print(p.listing, markup=False, highlight=False)
    console.print(
        f"{met} MET, {missed} MISSED; load average (1, 5, 15 min) "
        f"{' '.join(f'{x:.2f}' for x in loads_before)} at the start, "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end, {os.cpu_count()} CPUs"
    )
    figure = args.out / f"encoding{'-quick' if args.quick else ''}.png"
    plot(figure, rows)
    console.print(f"plot: {figure}")


if __name__ == "__main__":
    main()
