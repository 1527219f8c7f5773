"""Soak: gyre's data path at the paper's load, then past it, on this machine.

    .venv/bin/python benchmarks/soak.py [--executions 1152] [--duration 600] [--workers 2]
        [--steps 2,5,10] [--step-duration 60] [--max-in-flight 256] [--sequence-cache-mb 1024]
        [--quick] [--json OUT] [--pg URL]

Processes, all on this machine: a scripted engine speaking SGLang's API (``--serve-engine``:
each answer streams prose then one ``<tool_call>`` at ``--decode-rate`` tokens/s per stream,
``--stream-interval`` tokens a chunk, as SGLang's option of that name); ``gyre proxy serve
--workers N --max-in-flight M`` on a scratch PostgreSQL database; harness processes
(``--serve-harness``) that keep executions in flight through real HTTP with the official
SDKs, half of them Anthropic Messages and half OpenAI Chat Completions, all streamed. An
execution starts from a history of ``--history`` tokens, sends a call, appends the answer
and the tool result (``--tool-result`` tokens), waits as a tool would, and sends the next;
past ``--compact-at`` tokens it asks for a summary and starts again from it. A refused call
(Anthropic 529 / OpenAI 429) is sent again after its retry-after until it is answered, past
the phase's end too; a refusal is not an answer.

1. The paper's load: ``--executions`` in flight for ``--duration`` s, each calling every
   ``--executions / --rate`` s on average (the paper: 1,152 executions, about 100 calls/s).
2. Then steps of ``--steps`` times the paper's call rate, ``--step-duration`` s each: more
   executions in flight once the wait between calls is down to ``--min-think`` s.

Per phase: calls/s answered, generated tokens/s, proxy CPU per call and per generated token
(/proc of the proxy's workers), the added latency p50/p99 (the proxy's own
``x-gyre-overhead-duration-ms`` on each answer), the store's append rate (records per s),
the spool's largest backlog (``/health``, sampled each second), refusals by status, the
largest resident set of a proxy worker and the largest sequence and chain caches ``/health``
reported (sampled each second), and the CPU each part of the system took (proxy, engine,
harness, PostgreSQL) beside the machine's idle share. At the end, after the spool is
drained: every execution's answered calls, counted by the harness, against its records in the
store (not aborted): equal for every one of them, or the executions that differ.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
console = Console(width=170)

PAPER_EXECUTIONS = 1152
PAPER_RATE = 100.0  # calls/s at 1,152 executions in flight
TARGET_P50_MS = 3.0  # the README's added-latency targets
TARGET_P99_MS = 15.0
OVERHEAD_HEADER = "x-gyre-overhead-duration-ms"
TOOL = {
    "name": "Bash",
    "description": "Run a shell command in the repository and return what it printed.",
    "schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
}


# -- the scripted engine -----------------------------------------------------------------------


def serve_engine(port: int, rate: float, interval: int, answer: tuple[int, int], seed: int) -> None:
    """An SGLang-API engine: prose, then ``<tool_call>``, then ``<|im_end|>``, within the
    request's ``max_new_tokens``; ``interval`` tokens a chunk, each stream at ``rate`` tokens/s
    on its own clock from its arrival. Every request's input ids are parsed, as a server must."""
    import msgspec
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    from gyre_proxy.engines import qwen_tokenizer
    from gyre_proxy.ingest.tracegen import WORDS

    tok = qwen_tokenizer()
    rng = random.Random(seed)
    prose = tok.encode(" ".join(rng.choice(WORDS) for _ in range(4 * answer[1])))
    end = tok.special("<|im_end|>")
    step = interval / rate

    def tool_call(n: int) -> list[int]:
        call = json.dumps({"name": "Bash", "arguments": {"command": f"make check-{n}"}})
        return tok.encode(f"\n<tool_call>\n{call}\n</tool_call>")

    async def generate(request: Request) -> StreamingResponse:
        body = msgspec.json.decode(await request.body())
        n_prompt = len(body["input_ids"])
        rid = body.get("rid") or uuid.uuid4().hex
        budget = int(body["sampling_params"].get("max_new_tokens") or answer[1])
        call = tool_call(rng.randrange(10_000))
        n = min(budget, rng.randint(*answer))
        start = rng.randrange(len(prose) - answer[1])
        out = [*prose[start : start + max(0, n - len(call) - 1)], *call, end][-max(1, n) :]
        loop = asyncio.get_running_loop()
        arrived = loop.time()

        async def chunks():  # type: ignore[no-untyped-def]
            for k in range(0, len(out), interval):
                part = out[k : k + interval]
                await asyncio.sleep(arrived + (k // interval + 1) * step - loop.time())
                meta: dict[str, object] = {
                    "id": rid,
                    "prompt_tokens": n_prompt,
                    "completion_tokens": k + len(part),
                    "output_token_logprobs": [[-0.1, t, None] for t in part],
                    "weight_version": "0",
                }
                if k + interval >= len(out):
                    meta["finish_reason"] = (
                        {"type": "stop", "matched": end}
                        if out[-1] == end
                        else {"type": "length", "length": len(out)}
                    )
                yield b"data: " + msgspec.json.encode({"output_ids": part, "meta_info": meta}) + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    async def ok(request: Request) -> JSONResponse:
        return JSONResponse({"model_path": "soak", "weight_version": "0"})

    app = Starlette(
        routes=[
            Route("/generate", generate, methods=["POST"]),
            Route("/abort_request", ok, methods=["POST"]),
            Route("/health", ok),
            Route("/model_info", ok),
        ]
    )
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", timeout_keep_alive=75, backlog=4096)


# -- the scripted harness ----------------------------------------------------------------------


@dataclass
class HarnessResult:
    """What one harness process saw: answers per execution, refusals, errors, latencies."""

    answered: dict[str, int] = field(default_factory=dict)
    refused: dict[str, int] = field(default_factory=dict)  # by HTTP status
    errors: list[str] = field(default_factory=list)
    overhead_ms: list[float] = field(default_factory=list)
    latency_s: list[float] = field(default_factory=list)
    output_tokens: int = 0
    compactions: int = 0
    largest_history: int = 0


def words(rng: random.Random, n: int) -> str:
    from gyre_proxy.ingest.tracegen import WORDS

    return " ".join(rng.choice(WORDS) for _ in range(n))


async def run_harness(spec: dict[str, Any]) -> HarnessResult:
    """Keep ``spec``'s executions calling until its deadline; each call's answer goes into the
    history with a tool result, as a harness running the tool would."""
    import anthropic
    import httpx2
    import openai

    result = HarnessResult()
    # Ready (imports done), then wait for the start: the phase's clock starts when every
    # harness process can call, not while they are still importing the SDKs.
    Path(spec["ready"]).write_text("ready")
    go = Path(spec["go"])
    while not go.exists():
        await asyncio.sleep(0.02)
    deadline = float(go.read_text())
    think = spec["think_s"]
    lo, hi = spec["tool_result"]
    http = httpx2.AsyncClient(
        limits=httpx2.Limits(max_connections=len(spec["executions"]) + 16, max_keepalive_connections=None),
        timeout=httpx2.Timeout(600.0, connect=60.0),
    )
    base = spec["base_url"]

    async def execution(execution_id: str, key: str, api: str, seed: int) -> None:
        rng = random.Random(seed)
        task = f"Execution {execution_id}. The repository:\n" + words(rng, rng.randint(*spec["history"]))
        anthropic_history: list[dict[str, Any]] = [{"role": "user", "content": task}]
        openai_history: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": task},
        ]
        claude = anthropic.AsyncAnthropic(api_key=key, base_url=base, http_client=http, max_retries=0)
        gpt = openai.AsyncOpenAI(api_key=key, base_url=base + "/v1", http_client=http, max_retries=0)
        await asyncio.sleep(rng.uniform(0, think + spec["answer_s"]))
        summarize = False
        refused = False  # a refused call is sent again until it is answered, deadline or not
        while refused or time.time() < deadline:
            began = time.perf_counter()
            ask = "Summarize the work so far for a fresh context." if summarize else None
            try:
                if api == "anthropic":
                    text, call, used, out, overhead = await anthropic_call(claude, anthropic_history, ask)
                else:
                    text, call, used, out, overhead = await openai_call(gpt, openai_history, ask)
            except (anthropic.APIStatusError, openai.APIStatusError) as exc:
                if exc.status_code in (429, 529):
                    key_ = str(exc.status_code)
                    result.refused[key_] = result.refused.get(key_, 0) + 1
                    refused = True
                    await asyncio.sleep(float(exc.response.headers.get("retry-after", "1")))
                    continue
                result.errors.append(f"{api} {exc.status_code}: {str(exc)[:200]}")
                refused = False
                await asyncio.sleep(1.0)
                continue
            except (anthropic.APIError, openai.APIError) as exc:
                result.errors.append(f"{api} {type(exc).__name__}: {str(exc)[:200]}")
                refused = False
                await asyncio.sleep(1.0)
                continue
            refused = False
            result.latency_s.append(time.perf_counter() - began)
            result.answered[execution_id] = result.answered.get(execution_id, 0) + 1
            result.output_tokens += out
            if overhead is not None:
                result.overhead_ms.append(overhead)
            result.largest_history = max(result.largest_history, used)
            if summarize:
                result.compactions += 1
                summary = f"{task[:200]}\nSummary of the work so far:\n{text}"
                anthropic_history = [{"role": "user", "content": summary}]
                openai_history = [openai_history[0], {"role": "user", "content": summary}]
                summarize = False
                continue
            output = words(rng, rng.randint(lo, hi))
            if api == "anthropic":
                content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
                if call is not None:
                    content.append(
                        {"type": "tool_use", "id": call[0], "name": call[1], "input": json.loads(call[2])}
                    )
                    reply: Any = [{"type": "tool_result", "tool_use_id": call[0], "content": output}]
                else:
                    reply = output
                anthropic_history += [
                    {"role": "assistant", "content": content},
                    {"role": "user", "content": reply},
                ]
            else:
                message: dict[str, Any] = {"role": "assistant", "content": text or None}
                if call is not None:
                    message["tool_calls"] = [
                        {
                            "id": call[0],
                            "type": "function",
                            "function": {"name": call[1], "arguments": call[2]},
                        }
                    ]
                    openai_history += [message, {"role": "tool", "tool_call_id": call[0], "content": output}]
                else:
                    openai_history += [message, {"role": "user", "content": output}]
            summarize = used + out + hi * 1.4 > spec["compact_at"]
            await asyncio.sleep(rng.uniform(0.5 * think, 1.5 * think))

    await asyncio.gather(*(execution(*e) for e in spec["executions"]))
    await http.aclose()
    return result


async def anthropic_call(
    claude: Any, history: list[dict[str, Any]], ask: str | None
) -> tuple[str, tuple[str, str, str] | None, int, int, float | None]:
    """One streamed Messages call: (text, (tool id, name, input JSON) or None, input tokens,
    output tokens, the proxy's overhead in ms)."""
    messages = history if ask is None else [*history, {"role": "user", "content": ask}]
    tools = [{"name": TOOL["name"], "description": TOOL["description"], "input_schema": TOOL["schema"]}]
    stream = await claude.messages.create(
        model="gyre-policy", max_tokens=1024, system="You are a coding agent.", tools=tools,
        messages=messages, stream=True,
    )  # fmt: skip
    header = stream.response.headers.get(OVERHEAD_HEADER)
    text: list[str] = []
    call: list[str] | None = None
    used = out = 0
    async for event in stream:
        if event.type == "message_start":
            used = event.message.usage.input_tokens
        elif event.type == "content_block_start" and event.content_block.type == "tool_use":
            call = [event.content_block.id, event.content_block.name, ""]
        elif event.type == "content_block_delta":
            if event.delta.type == "text_delta":
                text.append(event.delta.text)
            elif event.delta.type == "input_json_delta" and call is not None:
                call[2] += event.delta.partial_json
        elif event.type == "message_delta":
            out = event.usage.output_tokens
    found = None if call is None else (call[0], call[1], call[2] or "{}")
    return "".join(text), found, used, out, None if header is None else float(header)


async def openai_call(
    gpt: Any, history: list[dict[str, Any]], ask: str | None
) -> tuple[str, tuple[str, str, str] | None, int, int, float | None]:
    """One streamed Chat Completions call; the same tuple as ``anthropic_call``."""
    messages = history if ask is None else [*history, {"role": "user", "content": ask}]
    tools = [{"type": "function", "function": {"name": TOOL["name"], "description": TOOL["description"],
                                               "parameters": TOOL["schema"]}}]  # fmt: skip
    stream = await gpt.chat.completions.create(
        model="gyre-policy", max_tokens=1024, tools=tools, messages=messages, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    header = stream.response.headers.get(OVERHEAD_HEADER)
    text: list[str] = []
    call: list[str] | None = None
    used = out = 0
    async for chunk in stream:
        if chunk.usage is not None:
            used, out = chunk.usage.prompt_tokens, chunk.usage.completion_tokens
        for choice in chunk.choices:
            if choice.delta.content:
                text.append(choice.delta.content)
            for tc in choice.delta.tool_calls or ():
                if call is None:
                    call = [tc.id or "", (tc.function and tc.function.name) or "", ""]
                if tc.function and tc.function.arguments:
                    call[2] += tc.function.arguments
    found = None if call is None else (call[0], call[1], call[2] or "{}")
    return "".join(text), found, used, out, None if header is None else float(header)


def harness_main(spec_path: str, out_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    result = asyncio.run(run_harness(spec))
    Path(out_path).write_text(json.dumps(asdict(result)))


# -- measuring ---------------------------------------------------------------------------------


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (its own and its reaped children's), from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def postgres_pids() -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() in ("postgres", "postmaster"):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def rss_mib(pid: int) -> float:
    """Resident set of ``pid`` now, in MiB (VmRSS); 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def machine_ticks() -> tuple[int, int]:
    """Idle and total CPU ticks of the machine so far (/proc/stat)."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    return ticks[3] + ticks[4], sum(ticks)


@dataclass
class Cpu:
    """CPU seconds so far of each part, and the machine's idle and total ticks."""

    parts: dict[str, float]
    idle: int
    total: int

    @staticmethod
    def now(proxy: int, engine: int, harness: list[int]) -> Cpu:
        workers = children(proxy)
        pg = postgres_pids()
        idle, total = machine_ticks()
        return Cpu(
            {
                "proxy": cpu_seconds(proxy) + sum(cpu_seconds(w) for w in workers),
                "engine": cpu_seconds(engine),
                "harness": sum(cpu_seconds(h) for h in harness),
                # every backend of this server: other databases' clients too (the machine is shared)
                "postgres": sum(cpu_seconds(p) for p in pg),
            },
            idle,
            total,
        )


def records(url: str) -> tuple[int, dict[str, int]]:
    """All model-call records, and the not-aborted ones per execution."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT stream_id, count(*) FILTER (WHERE body->>'finish' <> 'abort'), count(*) FROM gyre_events "
            "WHERE event_type = 'model_call.recorded' GROUP BY stream_id"
        ).fetchall()
    return sum(int(r[2]) for r in rows), {str(r[0]): int(r[1]) for r in rows}


def health(base: str) -> dict[str, Any]:
    try:
        return dict(httpx.get(f"{base}/health", timeout=5).json())
    except (httpx.HTTPError, ValueError):
        return {}


@dataclass
class Phase:
    name: str
    executions: int
    offered_rate: float
    seconds: float
    harness: HarnessResult
    cpu: dict[str, float]  # CPU seconds per part over the phase
    idle_share: float
    appended: int
    largest_backlog: int
    proxy_rss_mib: float  # the largest resident set of one proxy worker, sampled each second
    sequence_cache_mib: float  # the largest sequence cache /health reported (of the worker answering)
    chain_cache_mchars: float  # the largest chain cache /health reported, in 2**20 characters

    @property
    def answered(self) -> int:
        return sum(self.harness.answered.values())

    def quantile_ms(self, q: float) -> float:
        xs = sorted(self.harness.overhead_ms)
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def merge(results: list[HarnessResult]) -> HarnessResult:
    out = HarnessResult()
    for r in results:
        for k, v in r.answered.items():
            out.answered[k] = out.answered.get(k, 0) + v
        for k, v in r.refused.items():
            out.refused[k] = out.refused.get(k, 0) + v
        out.errors += r.errors
        out.overhead_ms += r.overhead_ms
        out.latency_s += r.latency_s
        out.output_tokens += r.output_tokens
        out.compactions += r.compactions
        out.largest_history = max(out.largest_history, r.largest_history)
    return out


# -- the run -----------------------------------------------------------------------------------


@contextmanager
def processes(
    args: argparse.Namespace, url: str, work: Path
) -> Iterator[tuple[subprocess.Popen[bytes], subprocess.Popen[bytes], str]]:
    """The engine and ``gyre proxy serve --workers N`` over it; stopped in order."""
    env = {**os.environ, "GYRE_DATABASE_URL": url, "PYTHONPATH": str(ROOT), "GYRE_DATA_DIR": str(work)}
    eport, pport = free_port(), free_port()
    engine = subprocess.Popen(
        [sys.executable, __file__, "--serve-engine", str(eport), "--decode-rate", str(args.decode_rate),
         "--stream-interval", str(args.stream_interval), "--answer-tokens", args.answer_tokens],
        env=env,
    )  # fmt: skip
    proxy = subprocess.Popen(
        [sys.executable, "-m", "gyre_tools.cli", "proxy", "serve", "--engine", f"e0=http://127.0.0.1:{eport}",
         "--port", str(pport), "--harness", "generic", "--workers", str(args.workers),
         "--max-in-flight", str(args.max_in_flight), "--retry-after", str(args.retry_after),
         "--sequence-cache-mb", str(args.sequence_cache_mb)],
        env=env, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    base = f"http://127.0.0.1:{pport}"
    try:
        for url_ in (f"http://127.0.0.1:{eport}/health", f"{base}/health"):
            deadline = time.monotonic() + 180
            while True:
                try:
                    if httpx.get(url_, timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline or proxy.poll() is not None or engine.poll() is not None:
                    raise SystemExit(f"soak: {url_} did not come up")
                time.sleep(0.3)
        yield proxy, engine, base
    finally:
        for p in (proxy, engine):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in (proxy, engine):
            try:
                p.wait(120)
            except subprocess.TimeoutExpired:
                p.kill()


def run_phase(
    args: argparse.Namespace, name: str, executions: int, think_s: float, seconds: float, offered: float,
    url: str, base: str, proxy: int, engine: int, work: Path,
) -> Phase:  # fmt: skip
    from gyre_proxy.service import issue_key
    from gyre_store import PostgresEventLog, StoreConfig

    console.print(
        f"[bold]{name}[/]: {executions} executions, {think_s:.2f} s between calls, {seconds:.0f} s ..."
    )
    with PostgresEventLog(StoreConfig(url)) as log:
        keys = [
            (f"{name}-{i}", issue_key(log, execution_id=f"{name}-{i}", run_id="soak", harness="generic"),
             "anthropic" if i % 2 == 0 else "openai", args.seed * 1_000_003 + zlib.crc32(name.encode()) + i)
            for i in range(executions)
        ]  # fmt: skip
    procs, outs = [], []
    n = max(1, min(args.harness_procs, executions))
    go = work / f"{name}.go"
    for k in range(n):
        spec = {
            "base_url": base, "ready": str(work / f"{name}-{k}.ready"), "go": str(go), "think_s": think_s, "executions": keys[k::n],
            "history": [int(x) for x in args.history.split("-")],
            "tool_result": [int(x) for x in args.tool_result.split("-")], "compact_at": args.compact_at,
            "answer_s": answer_seconds(args),
        }  # fmt: skip
        spec_path, out_path = work / f"{name}-{k}.json", work / f"{name}-{k}.out.json"
        spec_path.write_text(json.dumps(spec))
        outs.append(out_path)
        procs.append(
            subprocess.Popen([sys.executable, __file__, "--serve-harness", str(spec_path), str(out_path)])
        )
    harness_pids = [p.pid for p in procs]
    while not all((work / f"{name}-{k}.ready").exists() for k in range(n)):
        if any(p.poll() is not None for p in procs):
            raise SystemExit(f"soak: a harness process of {name} exited before it was ready")
        time.sleep(0.05)
    before_records, _ = records(url)
    cpu0 = Cpu.now(proxy, engine, [])
    harness0 = {pid: cpu_seconds(pid) for pid in harness_pids}
    began = time.perf_counter()
    (work / f"{name}.go.tmp").write_text(repr(time.time() + seconds))
    (work / f"{name}.go.tmp").rename(go)
    harness_cpu: dict[int, float] = {}
    backlog, rss, cache, chains = 0, 0.0, 0.0, 0.0
    while any(p.poll() is None for p in procs):
        h = health(base)
        backlog = max(backlog, int(h.get("spool_pending", 0)))
        rss = max([rss, rss_mib(proxy), *(rss_mib(w) for w in children(proxy))])
        cache = max(cache, int(h.get("sequence_cache_bytes", 0)) / 2**20)
        chains = max(chains, int(h.get("chain_cache_chars", 0)) / 2**20)
        for pid in harness_pids:
            harness_cpu[pid] = max(harness_cpu.get(pid, 0.0), cpu_seconds(pid))
        time.sleep(1.0)
    elapsed = time.perf_counter() - began
    cpu1 = Cpu.now(proxy, engine, [])
    after_records, _ = records(url)
    results = []
    for p, out in zip(procs, outs, strict=True):
        if p.returncode != 0 or not out.exists():
            raise SystemExit(f"soak: a harness process of {name} failed ({p.returncode})")
        results.append(HarnessResult(**json.loads(out.read_text())))
    parts = {k: cpu1.parts[k] - cpu0.parts[k] for k in cpu0.parts}
    parts["harness"] = sum(harness_cpu.values()) - sum(harness0.values())
    idle = (cpu1.idle - cpu0.idle) / max(1, cpu1.total - cpu0.total)
    merged = merge(results)
    xs = sorted(merged.overhead_ms) or [float("nan")]
    calls = sum(merged.answered.values())
    console.print(
        f"  {name}: {calls / elapsed:.1f} calls/s answered in {elapsed:.0f} s, {merged.output_tokens / elapsed:,.0f} "
        f"tokens/s, overhead p50 {xs[len(xs) // 2]:.1f} ms p99 {xs[min(len(xs) - 1, int(0.99 * len(xs)))]:.1f} ms, "
        f"refused {merged.refused}, errors {len(merged.errors)}, CPU s/s "
        + ", ".join(f"{k} {v / elapsed:.2f}" for k, v in parts.items())
        + f", idle {idle:.0%}; proxy worker RSS max {rss:,.0f} MiB, sequence cache max {cache:,.0f} MiB, "
        f"chain cache max {chains:,.0f} Mi characters"
    )
    return Phase(
        name,
        executions,
        offered,
        elapsed,
        merge(results),
        parts,
        idle,
        after_records - before_records,
        backlog,
        rss,
        cache,
        chains,
    )


def answer_seconds(args: argparse.Namespace) -> float:
    lo, hi = (int(x) for x in args.answer_tokens.split("-"))
    return (lo + hi) / 2 / args.decode_rate


def plan(args: argparse.Namespace, multiple: float) -> tuple[int, float, float]:
    """(executions, seconds between calls, offered calls/s) for ``multiple`` x the paper's rate."""
    rate = args.rate * multiple
    cycle = args.executions / rate
    think = cycle - answer_seconds(args)
    if think >= args.min_think:
        return args.executions, think, rate
    executions = math.ceil(rate * (answer_seconds(args) + args.min_think))
    return executions, args.min_think, rate


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--executions", type=int, default=PAPER_EXECUTIONS)
    parser.add_argument("--rate", type=float, help="calls/s at --executions (default: the paper's, scaled)")
    parser.add_argument("--duration", type=float, default=600.0)
    parser.add_argument("--steps", default="2,5,10", help="multiples of the paper's call rate, after it")
    parser.add_argument("--step-duration", type=float, default=60.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--max-in-flight", type=int, default=256, help="per proxy worker")
    parser.add_argument("--retry-after", type=float, default=1.0)
    parser.add_argument("--sequence-cache-mb", type=int, default=1024, help="per proxy worker")
    parser.add_argument("--decode-rate", type=float, default=50.0, help="tokens/s per stream")
    parser.add_argument("--stream-interval", type=int, default=4, help="tokens per streamed chunk")
    parser.add_argument("--answer-tokens", default="40-260")
    parser.add_argument("--history", default="1000-40000", help="tokens an execution starts from")
    parser.add_argument("--tool-result", default="100-1500", help="tokens (words) per tool result")
    parser.add_argument("--compact-at", type=int, default=100_000)
    parser.add_argument("--min-think", type=float, default=0.5)
    parser.add_argument("--harness-procs", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--quick", action="store_true", help="the CI version: see tests/acceptance/test_soak.py"
    )
    parser.add_argument("--json", help="write the figures here too")
    parser.add_argument(
        "--pg", default=os.environ.get("GYRE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
    )
    parser.add_argument("--serve-engine", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve-harness", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    lo_hi = tuple(int(x) for x in args.answer_tokens.split("-"))
    if args.serve_engine:
        serve_engine(
            args.serve_engine, args.decode_rate, args.stream_interval, (lo_hi[0], lo_hi[1]), args.seed
        )
        return 0
    if args.serve_harness:
        harness_main(*args.serve_harness)
        return 0
    if args.quick:
        # Few executions, short phases, small histories that still compact; the overload
        # step's bound is far below its load, so refusals are certain.
        args.executions, args.duration, args.step_duration = 24, 10.0, 8.0
        args.steps, args.max_in_flight, args.harness_procs = "8", 4, 2
        args.history, args.tool_result, args.compact_at = "200-500", "50-300", 600
        args.answer_tokens, args.retry_after, args.rate = "20-80", 0.5, 10.0
    if args.rate is None:
        args.rate = PAPER_RATE * args.executions / PAPER_EXECUTIONS
    from scratch import scratch_database

    phases: list[Phase] = []
    with (
        tempfile.TemporaryDirectory(prefix="gyre-soak-") as tmp,
        scratch_database(args.pg, "gyre_soak") as url,
    ):
        work = Path(tmp)
        with processes(args, url, work) as (proxy, engine, base):
            executions, think, rate = plan(args, 1.0)
            phases.append(run_phase(args, "paper", executions, think, args.duration, rate, url, base,
                                    proxy.pid, engine.pid, work))  # fmt: skip
            for m in (float(x) for x in args.steps.split(",") if x):
                executions, think, rate = plan(args, m)
                phases.append(run_phase(args, f"x{m:g}", executions, think, args.step_duration, rate, url,
                                        base, proxy.pid, engine.pid, work))  # fmt: skip
            # Drain: every staged record written before the proxy stops (it flushes on SIGTERM too).
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and any(
                int(health(base).get("spool_pending", 0)) for _ in range(4)
            ):
                time.sleep(0.5)
            final = health(base)
        total, stored = records(url)
    return report(args, phases, stored, total, final)


def report(
    args: argparse.Namespace, phases: list[Phase], stored: dict[str, int], total: int, final: dict[str, Any]
) -> int:
    answered: dict[str, int] = {}
    for p in phases:
        answered.update(p.harness.answered)
    differ = {
        e: (answered.get(e, 0), stored.get(e, 0))
        for e in set(answered) | set(stored)
        if answered.get(e, 0) != stored.get(e, 0)
    }
    errors = [e for p in phases for e in p.harness.errors]
    table = Table(title=f"soak: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end")
    for c in ("phase", "executions", "calls/s offered / answered", "generated tokens/s", "proxy CPU per call / token",
              "added latency p50 / p99 (ms)", "store appends/s", "spool backlog max", "refused 529 / 429",
              "proxy worker RSS max", "CPU s/s proxy, engine, harness, postgres; idle"):  # fmt: skip
        table.add_column(c)
    figures = []
    for p in phases:
        calls = p.answered
        tokens = p.harness.output_tokens
        cpu = p.cpu
        row = {
            "phase": p.name, "executions": p.executions, "offered_calls_s": p.offered_rate,
            "answered_calls_s": calls / p.seconds, "generated_tokens_s": tokens / p.seconds,
            "proxy_cpu_ms_per_call": cpu["proxy"] / max(calls, 1) * 1e3,
            "proxy_cpu_ms_per_token": cpu["proxy"] / max(tokens, 1) * 1e3,
            "overhead_p50_ms": p.quantile_ms(0.5), "overhead_p99_ms": p.quantile_ms(0.99),
            "latency_p50_s": statistics.median(p.harness.latency_s) if p.harness.latency_s else float("nan"),
            "appends_s": p.appended / p.seconds, "spool_backlog_max": p.largest_backlog,
            "refused": p.harness.refused, "errors": len(p.harness.errors),
            "cpu_s_per_s": {k: v / p.seconds for k, v in cpu.items()}, "idle_share": p.idle_share,
            "compactions": p.harness.compactions, "largest_history_tokens": p.harness.largest_history,
            "seconds": p.seconds, "proxy_worker_rss_mib_max": p.proxy_rss_mib,
            "sequence_cache_mib_max": p.sequence_cache_mib, "chain_cache_mchars_max": p.chain_cache_mchars,
        }  # fmt: skip
        figures.append(row)
        table.add_row(
            p.name, str(p.executions), f"{p.offered_rate:.1f} / {row['answered_calls_s']:.1f}",
            f"{row['generated_tokens_s']:,.0f}",
            f"{row['proxy_cpu_ms_per_call']:.2f} ms / {row['proxy_cpu_ms_per_token']:.3f} ms",
            f"{row['overhead_p50_ms']:.1f} / {row['overhead_p99_ms']:.1f}", f"{row['appends_s']:.1f}",
            str(p.largest_backlog), f"{p.harness.refused.get('529', 0)} / {p.harness.refused.get('429', 0)}",
            f"{p.proxy_rss_mib:,.0f} MiB", ", ".join(f"{v / p.seconds:.2f}" for v in cpu.values()) + f"; {p.idle_share:.0%}",
        )  # fmt: skip
    console.print(table)
    paper = figures[0]
    exact = not differ and not errors
    verdicts = {
        "every answered call recorded exactly once": not differ,
        "every request answered (no error but refusals)": not errors and all(p.answered for p in phases),
        f"paper load answered (>= 95% of {paper['offered_calls_s']:.1f} calls/s offered)": paper["answered_calls_s"] >= 0.95 * paper["offered_calls_s"],
        f"added latency at paper load p50 <= {TARGET_P50_MS:g} ms": paper["overhead_p50_ms"] <= TARGET_P50_MS,
        f"added latency at paper load p99 <= {TARGET_P99_MS:g} ms": paper["overhead_p99_ms"] <= TARGET_P99_MS,
        "no record lost by the spool": int(final.get("spool_lost", 0)) == 0,
    }  # fmt: skip
    for name, ok in verdicts.items():
        console.print(f"{name}: {'[green]MET[/]' if ok else '[red]MISSED[/]'}")
    console.print(
        f"records in the store: {total} ({sum(stored.values())} not aborted) against {sum(answered.values())} "
        f"answers the harness counted over {len(answered)} executions; executions that differ: {len(differ)}"
    )
    if differ:
        console.print(f"  for example: {dict(list(differ.items())[:5])}")
    if errors:
        console.print(f"errors ({len(errors)}): {errors[:5]}")
    first = next(
        (f for f in figures if f["answered_calls_s"] < 0.9 * f["offered_calls_s"] or f["refused"]), None
    )
    if first is not None:
        busiest = max(first["cpu_s_per_s"], key=first["cpu_s_per_s"].get)
        console.print(
            f"first limit: phase {first['phase']} ({first['offered_calls_s']:.0f} calls/s offered, "
            f"{first['answered_calls_s']:.1f} answered); machine idle {first['idle_share']:.0%}; "
            f"the busiest part: {busiest} at {first['cpu_s_per_s'][busiest]:.2f} CPU s/s"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({
            "phases": figures, "verdicts": verdicts, "differ": len(differ), "errors": errors[:20],
            "answered": sum(answered.values()), "stored": sum(stored.values()), "records": total,
            "executions": len(answered), "health": final, "exactly_once": exact,
        }, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
