"""Proxy benchmarks, each figure beside a baseline measured in the same run.

    .venv/bin/python benchmarks/bench_proxy.py [--modes streams,workers,encode]
        [--clients 128] [--histories 1000,10000,100000] [--decode-ms 50]
        [--answer-tokens 200-400] [--duration 30] [--rounds 2] [--workers 1] [--pg URL]

The target (README, docs/proxy.md): at 128 concurrent streaming executions the proxy adds at
most +3 ms at p50 and +15 ms at p99 to a call, proxied minus straight to the same engine in
the same run; and in the same mode the proxy spends at most 0.03 ms of CPU per streamed token
(its CPU over the proxied windows, from /proc, over the answer tokens of the calls counted). It is read for both the first token and the end of the answer. The two arms
alternate (direct, proxied, direct, proxied: ``--rounds`` windows each), so a change in the
machine's load reaches both rather than their difference.

1. ``streams``, the target's own mode: 128 executions, each with a request in flight at
   every moment (the next one is sent as soon as the last answer ends; the mean number in
   flight is measured and printed). The engine (an SGLang-API stand-in) streams answers of
   ``--answer-tokens`` tokens (drawn per execution and turn, the same in both arms), one
   token per chunk, one every ``--decode-ms`` from the request's arrival (20 tokens/s per
   stream and 2,560 tokens/s in all by default; each stream keeps its own clock, so an
   answer lasts as long in both arms and the difference is the proxy's). Each execution's history starts
   at one of ``--histories`` tokens and grows by the answer and a tool result per request;
   each size is its own mode. The first request of every execution (the whole history
   encoded at once) warms up and is not counted. Direct: the client posts the same number
   of input ids to the engine's ``/generate``; proxied: Anthropic Messages to
   ``gyre proxy serve`` (``--workers`` processes). Bodies are serialized before the clock
   starts in both arms. ``--duration`` seconds are counted per arm, split over its windows;
   each window begins with one uncounted call per execution. A verdict is MET or MISSED only
   when every window of both arms held at least 98% of ``--clients`` in flight on average;
   otherwise it is INVALID (the target's load was not there).
2. ``workers``: requests per second of a closed loop (128 clients, each on its own
   connection as a harness process is, the next request at once, answers of a few tokens in
   one chunk) through ``gyre proxy serve --workers 1`` and ``--workers 2``, beside the
   engine straight.
3. ``encode``: incremental encoding of a 100,000-token history that grew by one tool result,
   against encoding the whole history.
4. ``closed-loop`` and ``harness-load`` (not run by default; earlier figures were printed by
   them): 128 clients against an engine that answers in one chunk of a few tokens, with no
   pause or with ``--think-ms`` +- ``--jitter`` between requests. Neither is the target's
   mode: the closed loop measures queueing, harness load keeps one or two requests in flight.

The engine, the proxy and the clients run as separate processes on this machine and share
its cores; the proxy's CPU time per request comes from /proc.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import httpx
import msgspec
import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table
from scratch import scratch_database

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
console = Console(width=160)

# The target as the README states it: added latency at 128 concurrent streams (ms).
TARGET_P50_MS = 3.0
TARGET_P99_MS = 15.0
# The proxy's CPU per streamed token in the streams mode (ms), its calls' whole cost included.
TARGET_CPU_PER_TOKEN_MS = 0.03
# The streams mode's check that the target's load was there: the mean requests in flight of
# every window at least this share of --clients.
IN_FLIGHT_SHARE = 0.98


def _engine_app(generate: Callable[..., Awaitable[object]]) -> object:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def ok(request: Request) -> JSONResponse:
        return JSONResponse({"model_path": "bench", "weight_version": "0"})

    return Starlette(
        routes=[
            Route("/generate", generate, methods=["POST"]),
            Route("/abort_request", ok, methods=["POST"]),
            Route("/health", ok),
            Route("/model_info", ok),
        ]
    )


def _serve(app: object, port: int) -> None:
    import uvicorn

    # Keep idle connections longer than the clients do (as the proxy does), so a request is
    # never sent on a connection the server is just closing.
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", timeout_keep_alive=75)  # type: ignore[arg-type]


def instant_engine(port: int) -> None:
    """An SGLang-API engine that answers every /generate at once with 'OK.' and <|im_end|>."""
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse

    from gyre_proxy.engines import qwen_tokenizer

    tok = qwen_tokenizer()
    ids = [*tok.encode("OK."), tok.special("<|im_end|>")]

    def payload(rid: str, n_prompt: int) -> dict[str, object]:
        return {
            "text": "OK.",
            "output_ids": ids,
            "meta_info": {
                "id": rid,
                "finish_reason": {"type": "stop", "matched": ids[-1]},
                "prompt_tokens": n_prompt,
                "completion_tokens": len(ids),
                "output_token_logprobs": [[-0.1, t, None] for t in ids],
                "weight_version": "0",
            },
        }

    async def generate(request: Request) -> JSONResponse | StreamingResponse:
        body = await request.json()
        data = payload(body.get("rid") or uuid.uuid4().hex, len(body.get("input_ids", [])))
        if body.get("stream"):

            async def chunks():  # type: ignore[no-untyped-def]
                yield f"data: {json.dumps(data)}\n\n".encode()
                yield b"data: [DONE]\n\n"

            return StreamingResponse(chunks(), media_type="text/event-stream")
        return JSONResponse(data)

    _serve(_engine_app(generate), port)


def paced_engine(port: int, decode_ms: float, hi: int) -> None:
    """An SGLang-API engine that streams ``max_new_tokens`` tokens of prose (at most ``hi``,
    the last ``<|im_end|>``), one per chunk (SGLang's ``--incremental-streaming-output``
    shape), token k at ``(k + 1) x decode_ms`` after the request arrived. It parses every
    request's input ids, as a server must."""
    from starlette.requests import Request
    from starlette.responses import StreamingResponse

    from gyre_proxy.engines import qwen_tokenizer
    from gyre_proxy.ingest.tracegen import WORDS

    tok = qwen_tokenizer()
    prose = tok.encode(" ".join(WORDS[(i * 7) % len(WORDS)] for i in range(4 * hi)))[:hi]
    end = tok.special("<|im_end|>")
    step = decode_ms / 1e3

    async def generate(request: Request) -> StreamingResponse:
        body = msgspec.json.decode(await request.body())
        n_prompt = len(body["input_ids"])
        rid = body.get("rid") or uuid.uuid4().hex
        out = [*prose[: body["sampling_params"]["max_new_tokens"] - 1], end]
        loop = asyncio.get_running_loop()
        arrived = loop.time()

        async def chunks():  # type: ignore[no-untyped-def]
            for k, t in enumerate(out):
                # Each stream on its own clock from its arrival, so the answer's duration is
                # the same in both arms and the added latency is not lost in tick alignment.
                await asyncio.sleep(arrived + (k + 1) * step - loop.time())
                meta: dict[str, object] = {
                    "id": rid,
                    "prompt_tokens": n_prompt,
                    "completion_tokens": k + 1,
                    "output_token_logprobs": [[-0.1, t, None]],
                    "weight_version": "0",
                }
                if k == len(out) - 1:
                    meta["finish_reason"] = {"type": "stop", "matched": end}
                yield b"data: " + msgspec.json.encode({"output_ids": [t], "meta_info": meta}) + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    _serve(_engine_app(generate), port)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` and its reaped children so far (Linux
    /proc; NaN elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def cpu_times() -> tuple[int, int]:
    """The machine's stolen and total CPU ticks so far (Linux /proc/stat; zeros elsewhere)."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return 0, 0
    return (ticks[7] if len(ticks) > 7 else 0), sum(ticks[:8])


def tree_cpu_seconds(pid: int) -> float:
    """CPU time of ``pid`` and its live children (the workers of ``gyre proxy serve``)."""
    total = cpu_seconds(pid)
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = []
    return total + sum(cpu_seconds(int(c)) for c in children)


def wait_for(url: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} did not come up")


@dataclass(frozen=True)
class Call:
    """One timed request: when it was sent, its first answer token and its end (perf_counter
    s), and how long the engine takes to produce its answer (tokens x decode step)."""

    start: float
    first: float
    end: float
    paced: float


@dataclass(frozen=True)
class StreamRun:
    """The calls of one arm, the window they were counted in, and the proxy's CPU seconds."""

    calls: list[Call]  # those sent inside the window
    in_flight: float  # mean requests in flight over the window
    window_s: float
    tokens: int  # answer tokens the clients received inside the window's calls
    cpu_s: float  # CPU seconds of the engine (direct) or the proxy (proxied) over the window
    steal: float  # the share of the machine's CPU time its hypervisor took over the window
    load: float  # the 1-minute load average as the window closed


@dataclass(frozen=True)
class ArmWindows:
    """One arm's windows at one history size, each run between two of the other arm's."""

    windows: list[StreamRun]

    @property
    def calls(self) -> list[Call]:
        return [c for w in self.windows for c in w.calls]

    @property
    def window_s(self) -> float:
        return sum(w.window_s for w in self.windows)

    @property
    def tokens(self) -> int:
        return sum(w.tokens for w in self.windows)

    @property
    def cpu_s(self) -> float:
        return sum(w.cpu_s for w in self.windows)

    @property
    def in_flight(self) -> float:
        """Mean requests in flight over all the windows."""
        return sum(w.in_flight * w.window_s for w in self.windows) / self.window_s

    @property
    def fewest_in_flight(self) -> float:
        """The lowest window's mean in flight: the check holds only if every window held it."""
        return min(w.in_flight for w in self.windows)

    @property
    def steal(self) -> float:
        return sum(w.steal * w.window_s for w in self.windows) / self.window_s

    @property
    def loads(self) -> str:
        """The load averages as the windows closed: lowest to highest."""
        lo, hi = (f"{x:.1f}" for x in (min(w.load for w in self.windows), max(w.load for w in self.windows)))
        return lo if lo == hi else f"{lo} to {hi}"


def history_text(tokens: int) -> str:
    """Prose of about ``tokens`` Qwen tokens (words from the trace generator's vocabulary)."""
    from gyre_proxy.engines import qwen_tokenizer
    from gyre_proxy.ingest.tracegen import WORDS

    def prose(words: int) -> str:
        rng = random.Random(tokens)
        return " ".join(rng.choice(WORDS) for _ in range(words))

    # Words per token, measured on a sample, then the length that hits the size.
    sample = prose(2000)
    return prose(round(tokens * 2000 / len(qwen_tokenizer().encode(sample))))


def answer_text(sse: bytes) -> tuple[str, int]:
    """The text an Anthropic SSE body streamed, and how many text deltas carried it."""
    parts = [
        json.loads(line[6:])["delta"]["text"]
        for line in sse.split(b"\n")
        if line.startswith(b"data: ") and b'"text_delta"' in line
    ]
    return "".join(parts), len(parts)


async def stream_arm(
    *,
    clients: int,
    duration_s: float,
    send: Callable[[aiohttp.ClientSession, int], Awaitable[tuple[float, float, int]]],
    step_s: float,
    cpu: Callable[[], float],
    progress: Progress,
    label: str,
) -> StreamRun:
    """``clients`` closed loops of ``send`` (returns first-token time, end time, tokens).

    Every client first makes one warm-up call; the window opens when the last warm-up has
    ended and lasts ``duration_s``; calls sent inside it are counted, and every call's
    interval (warm-ups included) counts toward the mean number in flight over the window.
    """
    intervals: list[tuple[float, float]] = []
    counted: list[tuple[Call, int]] = []
    warmed = 0
    window: list[float] = []
    task = progress.add_task(f"{label}: warm-up", total=clients)
    connector = aiohttp.TCPConnector(limit=clients + 8)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as http:

        async def client(i: int) -> None:
            nonlocal warmed
            await asyncio.sleep(random.Random(i).uniform(0, 1.0))
            first_call = True
            while True:
                start = time.perf_counter()
                first, end, n = await send(http, i)
                intervals.append((start, end))
                if window and start >= window[0]:
                    counted.append((Call(start, first, end, n * step_s), n))
                    progress.advance(task)
                if window and end >= window[0] + duration_s:
                    return
                if first_call:
                    first_call = False
                    warmed += 1
                    progress.advance(task)
                    if warmed == clients:  # every execution is warm: open the window
                        window.append(time.perf_counter())
                        cpu_at.append(cpu())
                        machine.append(cpu_times())

                        def close() -> None:
                            cpu_at.append(cpu())
                            machine.append(cpu_times())

                        loop.call_later(duration_s, close)
                        progress.reset(task, total=None, description=f"{label}: {duration_s:.0f} s window")

        cpu_at: list[float] = []  # the CPU seconds when the window opens and closes
        machine: list[tuple[int, int]] = []  # the machine's (steal, total) CPU ticks, likewise
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(client(i) for i in range(clients)))
        cpu_s = cpu_at[1] - cpu_at[0]
    progress.remove_task(task)
    lo, hi = window[0], window[0] + duration_s
    busy = sum(max(0.0, min(e, hi) - max(s, lo)) for s, e in intervals)
    (steal0, total0), (steal1, total1) = machine
    return StreamRun(
        [c for c, _ in counted], busy / duration_s, duration_s, sum(n for _, n in counted), cpu_s,
        (steal1 - steal0) / max(total1 - total0, 1), os.getloadavg()[0],
    )  # fmt: skip


def stream_size(
    args: argparse.Namespace, env: dict[str, str], eport: int, engine_pid: int, size: int, progress: Progress
) -> tuple[ArmWindows, ArmWindows, int]:
    """Both arms at one history size, interleaved: ``--rounds`` windows of each, direct,
    proxied, direct, proxied, ..., through one fresh proxy; and the history's tokens.

    Alternating the arms puts a change in the machine's load (other jobs on the same cores)
    into both of them instead of into their difference. The proxy runs through the direct
    windows too (idle), so both arms see the same processes on the machine."""
    from gyre_proxy.engines import qwen_tokenizer
    from gyre_proxy.service import issue_key
    from gyre_store import PostgresEventLog, StoreConfig

    base = history_text(size)
    n_base = len(qwen_tokenizer().encode(base))
    run_id = f"streams-{size}"
    with PostgresEventLog(StoreConfig(env["GYRE_DATABASE_URL"])) as log:
        keys = [
            issue_key(log, execution_id=f"{run_id}-{i}", run_id=run_id, harness="generic")
            for i in range(args.clients)
        ]
    # Direct: the same number of input ids, growing by each answer and a tool result.
    # The engine reads the ids but not their meaning, so all clients share one list.
    pool = np.random.default_rng(size).integers(1000, 100_000, n_base + 100_000).tolist()
    lengths = [n_base] * args.clients
    turns = [0] * args.clients
    lo, hi = (int(x) for x in args.answer_tokens.split("-"))

    def answer_len(i: int, turn: int) -> int:
        """The answer length of execution i's turn, the same in both arms."""
        return random.Random(f"{size}-{i}-{turn}").randint(lo, hi)

    async def direct(http: aiohttp.ClientSession, i: int) -> tuple[float, float, int]:
        body = msgspec.json.encode({
            "input_ids": pool[: lengths[i]], "sampling_params": {"max_new_tokens": answer_len(i, turns[i]), "temperature": 1.0},
            "return_logprob": True, "stream": True, "rid": uuid.uuid4().hex,
        })  # fmt: skip
        first = 0.0
        chunks = 0
        async with http.post(f"http://127.0.0.1:{eport}/generate", data=body,
                             headers={"content-type": "application/json"}) as resp:  # fmt: skip
            async for chunk in resp.content.iter_any():
                if not first:
                    first = time.perf_counter()
                chunks += chunk.count(b"output_ids")
            assert resp.status == 200, resp.status
        end = time.perf_counter()
        n = answer_len(i, turns[i])
        assert chunks == n, (chunks, n)
        lengths[i] += n + 60  # the answer and a tool result
        turns[i] += 1
        return first, end, n

    histories = [
        [{"role": "user", "content": f"Execution {i}. Here is the repository:\n{base}"}]
        for i in range(args.clients)
    ]

    async def proxied(http: aiohttp.ClientSession, i: int) -> tuple[float, float, int]:
        msgs = histories[i]
        body = msgspec.json.encode({
            "model": "m", "max_tokens": answer_len(i, len(msgs) // 2), "stream": True,
            "system": "You are an agent.",
            "messages": msgs,
        })  # fmt: skip
        first = 0.0
        parts = []
        async with http.post(f"http://127.0.0.1:{pport}/v1/messages", data=body, headers={
            "x-api-key": keys[i], "anthropic-version": "2023-06-01", "content-type": "application/json",
        }) as resp:  # fmt: skip
            async for chunk in resp.content.iter_any():
                if not first and b"content_block_delta" in chunk:
                    first = time.perf_counter()
                parts.append(chunk)
            assert resp.status == 200, (resp.status, b"".join(parts)[:500])
        end = time.perf_counter()
        text, _ = answer_text(b"".join(parts))
        turn = len(msgs) // 2
        n = answer_len(i, turn)
        msgs.append({"role": "assistant", "content": text})
        msgs.append({"role": "user", "content": f"Tool output of turn {turn}: "
                     + "the command ran and printed its usual lines. " * 5})  # fmt: skip
        return first, end, n

    window_s = args.duration / args.rounds
    d: list[StreamRun] = []
    p: list[StreamRun] = []
    with proxy_process(env, eport, args.workers) as (proxy, pport):
        for r in range(args.rounds):
            # Every window starts with one uncounted call per execution, as the first does
            # (where the proxied one encodes the whole history).
            d.append(asyncio.run(stream_arm(
                clients=args.clients, duration_s=window_s, send=direct, step_s=args.decode_ms / 1e3,
                cpu=lambda: cpu_seconds(engine_pid), progress=progress,
                label=f"{size:,} direct {r + 1}/{args.rounds}",
            )))  # fmt: skip
            p.append(asyncio.run(stream_arm(
                clients=args.clients, duration_s=window_s, send=proxied, step_s=args.decode_ms / 1e3,
                cpu=lambda: tree_cpu_seconds(proxy.pid), progress=progress,
                label=f"{size:,} proxied {r + 1}/{args.rounds}",
            )))  # fmt: skip
    return ArmWindows(d), ArmWindows(p), n_base


def run_streams(args: argparse.Namespace, env: dict[str, str], table: Table, progress: Progress) -> list[str]:
    """The target's mode at each history size; returns the verdicts' one-line summaries."""
    eport = free_port()
    engine = subprocess.Popen(
        [sys.executable, __file__, "--serve-paced-engine", str(eport), "--decode-ms", str(args.decode_ms),
         "--answer-tokens", args.answer_tokens],
        env=env,
    )  # fmt: skip
    summary = []
    try:
        wait_for(f"http://127.0.0.1:{eport}/health")
        for size in (int(s) for s in args.histories.split(",")):
            d, p, n_base = stream_size(args, env, eport, engine.pid, size, progress)
            summary += add_stream_rows(table, f"{n_base / 1000:.0f}K-token histories", d, p, args)
    finally:
        engine.terminate()
        engine.wait(10)
    return summary


def quantiles(xs: list[float]) -> tuple[float, float]:
    a = np.array(xs) * 1e3
    return float(np.quantile(a, 0.5)), float(np.quantile(a, 0.99))


def add_stream_rows(
    table: Table, mode: str, d: ArmWindows, p: ArmWindows, args: argparse.Namespace
) -> list[str]:
    summary = []
    # The target is stated at 128 streams in flight: a window that held fewer measured another
    # load, so no verdict of this size is MET or MISSED then, whatever the difference says.
    need = IN_FLIGHT_SHARE * args.clients
    fewest = min(d.fewest_in_flight, p.fewest_in_flight)
    enough = fewest >= need
    # The answer's end is taken past the engine's own pace (its tokens x the decode step), so
    # answers of different lengths compare; the first token comes one decode step after arrival.
    for what, of in (
        ("first token", lambda c: c.first - c.start),
        ("answer end past the decode pace", lambda c: c.end - c.start - c.paced),
    ):
        dq, pq = quantiles([of(c) for c in d.calls]), quantiles([of(c) for c in p.calls])
        for k, (f, limit) in enumerate(((50, TARGET_P50_MS), (99, TARGET_P99_MS))):
            added = pq[k] - dq[k]
            if not enough:
                verdict = f"INVALID (a window held {fewest:.1f} in flight, under {need:.1f})"
            else:
                verdict = "MET" if added <= limit else "MISSED"
            table.add_row(f"{mode}: {what} p{f} (ms)", f"{pq[k]:.1f}", f"{dq[k]:.1f}",
                          f"{added:+.1f} ms", f"<= +{limit:.0f} ms: {verdict}")  # fmt: skip
            summary.append(f"{mode}, {what} p{f}: {added:+.1f} ms {verdict}")
    table.add_row(
        f"{mode}: mean requests in flight (lowest window)",
        f"{p.in_flight:.1f} ({p.fewest_in_flight:.1f})",
        f"{d.in_flight:.1f} ({d.fewest_in_flight:.1f})",
        "",
        f"{args.clients} at every moment (>= {need:.1f} in every window): "
        f"{'yes' if enough else 'NO, the verdicts above are INVALID'}",
    )
    table.add_row(
        f"{mode}: calls counted, answer tokens/s",
        f"{len(p.calls)}, {p.tokens / p.window_s:,.0f}",
        f"{len(d.calls)}, {d.tokens / d.window_s:,.0f}",
        "",
        "report",
    )
    table.add_row(
        f"{mode}: machine: CPU stolen by the hypervisor, load average at the windows' ends",
        f"{p.steal:.0%}, {p.loads}",
        f"{d.steal:.0%}, {d.loads}",
        "",
        f"report ({os.cpu_count()} cores)",
    )
    per_token = p.cpu_s / max(p.tokens, 1) * 1e3
    cpu_verdict = "MET" if per_token <= TARGET_CPU_PER_TOKEN_MS else "MISSED"
    if not enough:
        cpu_verdict = f"INVALID (a window held {fewest:.1f} in flight, under {need:.1f})"
    table.add_row(
        f"{mode}: CPU per call / per token (ms)",
        f"{p.cpu_s / len(p.calls) * 1e3:.1f} / {per_token:.3f} proxy",
        f"{d.cpu_s / len(d.calls) * 1e3:.1f} / {d.cpu_s / max(d.tokens, 1) * 1e3:.3f} engine",
        f"{per_token / max(d.cpu_s / max(d.tokens, 1) * 1e3, 1e-9):.2f}x the engine's",
        f"proxy per token <= {TARGET_CPU_PER_TOKEN_MS} ms: {cpu_verdict}",
    )
    summary.append(f"{mode}, proxy CPU per token: {per_token:.3f} ms {cpu_verdict}")
    return summary


@contextmanager
def proxy_process(
    env: dict[str, str], eport: int, workers: int
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """``gyre proxy serve --workers N`` on a free port, over the engine on ``eport``."""
    pport = free_port()
    proxy = subprocess.Popen(
        [sys.executable, "-m", "gyre_tools.cli", "proxy", "serve", "--engine", f"e0=http://127.0.0.1:{eport}",
         "--port", str(pport), "--harness", "generic", *(["--workers", str(workers)] if workers > 1 else [])],
        env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for(f"http://127.0.0.1:{pport}/health")
        yield proxy, pport
    finally:
        proxy.terminate()
        proxy.wait(30)


async def drive(
    clients: int,
    requests: int,
    one: object,
    *,
    think_s: float = 0.0,
    jitter: float = 0.0,
    seed: int = 0,
    own_connections: bool = False,
) -> tuple[list[float], float]:
    """Latencies of ``clients`` x ``requests`` calls of ``one``, and the seconds they took.

    With ``think_s`` each client starts at a random point of one pause and pauses
    ``think_s`` x uniform(1 - jitter, 1 + jitter) after every answer, as a harness does while
    it runs tools; without it the loop is closed (the next request follows at once). With
    ``own_connections`` each client keeps its own connection, as each harness process does;
    otherwise all share one pool.
    """
    latencies: list[float] = []
    rng = random.Random(seed)
    timeout = aiohttp.ClientTimeout(total=120)

    def session(limit: int) -> aiohttp.ClientSession:
        # aiohttp, not httpx: with 128 pooled connections httpx's pool costs the client process
        # milliseconds of CPU per request, which competes with the proxy for the same cores.
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=limit), timeout=timeout)

    shared = None if own_connections else session(clients + 8)

    async def client(i: int) -> None:
        http = shared or session(1)
        try:
            if think_s:
                await asyncio.sleep(rng.uniform(0, think_s))
            for r in range(requests):
                t = time.perf_counter()
                await one(http, i, r)  # type: ignore[operator]
                latencies.append(time.perf_counter() - t)
                if think_s:
                    await asyncio.sleep(think_s * rng.uniform(1 - jitter, 1 + jitter))
        finally:
            if shared is None:
                await http.close()

    began = time.perf_counter()
    try:
        await asyncio.gather(*(client(i) for i in range(clients)))
    finally:
        if shared is not None:
            await shared.close()
    return latencies, time.perf_counter() - began


@dataclass(frozen=True)
class Arm:
    """Direct and proxied latencies (s) at one load, their rates and CPU per request (ms)."""

    direct: list[float]
    proxied: list[float]
    direct_rps: float
    proxied_rps: float
    engine_ms: float
    proxy_ms: float


def add_rows(table: Table, mode: str, arm: Arm) -> None:
    for k, (f, limit) in enumerate(((50, TARGET_P50_MS), (99, TARGET_P99_MS))):
        pq, dq = quantiles(arm.proxied)[k], quantiles(arm.direct)[k]
        added = pq - dq
        verdict = "MET" if added <= limit else "MISSED"
        table.add_row(f"{mode}: p{f} latency (ms)", f"{pq:.1f}", f"{dq:.1f}", f"{added:+.1f} ms",
                      f"<= +{limit:.0f} ms: {verdict}, not the target's mode")  # fmt: skip
    table.add_row(f"{mode}: requests per second", f"{arm.proxied_rps:.0f}", f"{arm.direct_rps:.0f}",
                  f"{arm.proxied_rps / arm.direct_rps:.2f}", "report")  # fmt: skip
    table.add_row(f"{mode}: CPU per request (ms)", f"{arm.proxy_ms:.2f} proxy", f"{arm.engine_ms:.2f} engine",
                  f"{arm.proxy_ms / arm.engine_ms:.1f}x", "report")  # fmt: skip


class InstantLoad:
    """Clients of the instant engine, straight and through a proxy (the short-answer modes)."""

    def __init__(self, env: dict[str, str], eport: int, engine_pid: int, clients: int, run_id: str) -> None:
        from gyre_proxy.service import issue_key
        from gyre_store import PostgresEventLog, StoreConfig

        self.eport, self.engine_pid, self.clients = eport, engine_pid, clients
        with PostgresEventLog(StoreConfig(env["GYRE_DATABASE_URL"])) as log:
            self.keys = [
                issue_key(log, execution_id=f"{run_id}-{i}", run_id=run_id, harness="generic")
                for i in range(clients)
            ]
        self.histories: dict[int, list[dict[str, object]]] = {}
        self.prompt_ids = list(range(1000, 1400))
        self.pport = 0

    async def direct(self, http: aiohttp.ClientSession, i: int, r: int) -> None:
        body = {"input_ids": self.prompt_ids, "sampling_params": {"max_new_tokens": 16},
                "return_logprob": True, "stream": True}  # fmt: skip
        async with http.post(f"http://127.0.0.1:{self.eport}/generate", json=body) as resp:
            async for _ in resp.content.iter_any():
                pass

    async def proxied(self, http: aiohttp.ClientSession, i: int, r: int) -> None:
        msgs = self.histories.setdefault(i, [])
        msgs.append(
            {"role": "user", "content": f"turn {r} of client {i}: " + "please continue the work. " * 20}
        )
        body = {
            "model": "m",
            "max_tokens": 16,
            "stream": True,
            "system": "You are an agent.",
            "messages": msgs,
        }
        headers = {"x-api-key": self.keys[i], "anthropic-version": "2023-06-01"}
        async with http.post(
            f"http://127.0.0.1:{self.pport}/v1/messages", json=body, headers=headers
        ) as resp:
            async for _ in resp.content.iter_any():
                pass
            assert resp.status == 200, resp.status
        msgs.append({"role": "assistant", "content": "OK."})

    def measure(
        self, proxy_pid: int, requests: int, rounds: int, own_connections: bool = False, **pace: float
    ) -> Arm:
        """Both arms at one load, interleaved: ``requests`` per client split over ``rounds``
        rounds of direct then proxied (A B A B), so a change in the machine's load reaches
        both arms; latencies, rates and CPU per request over all rounds."""
        d: list[float] = []
        p: list[float] = []
        d_s = p_s = engine_s = proxy_s = 0.0
        rounds = max(1, min(rounds, requests))
        for r in range(rounds):
            n = requests // rounds + (r < requests % rounds)
            engine_cpu = cpu_seconds(self.engine_pid)
            lat, took = asyncio.run(
                drive(self.clients, n, self.direct, own_connections=own_connections, seed=r, **pace)
            )
            engine_s += cpu_seconds(self.engine_pid) - engine_cpu
            d += lat
            d_s += took
            proxy_cpu = tree_cpu_seconds(proxy_pid)
            lat, took = asyncio.run(
                drive(self.clients, n, self.proxied, own_connections=own_connections, seed=r, **pace)
            )
            proxy_s += tree_cpu_seconds(proxy_pid) - proxy_cpu
            p += lat
            p_s += took
        return Arm(d, p, len(d) / d_s, len(p) / p_s, engine_s / len(d) * 1e3, proxy_s / len(p) * 1e3)

    def warm(self) -> None:
        asyncio.run(drive(min(8, self.clients), 2, self.direct))
        asyncio.run(drive(min(8, self.clients), 2, self.proxied))


def run_instant(args: argparse.Namespace, env: dict[str, str], table: Table, modes: set[str]) -> None:
    """The short-answer modes: workers (requests per second at 1 and 2 workers), closed loop,
    harness load."""
    eport = free_port()
    engine = subprocess.Popen([sys.executable, __file__, "--serve-instant-engine", str(eport)], env=env)
    try:
        wait_for(f"http://127.0.0.1:{eport}/health")
        if "workers" in modes:
            rates = {}
            for workers in (1, 2):
                load = InstantLoad(env, eport, engine.pid, args.clients, f"workers-{workers}")
                with proxy_process(env, eport, workers) as (proxy, load.pport):
                    load.warm()
                    arm = load.measure(proxy.pid, args.requests, args.rounds, own_connections=True)
                rates[workers] = arm
                table.add_row(
                    f"closed loop, --workers {workers}: requests per second",
                    f"{arm.proxied_rps:.0f}", f"{arm.direct_rps:.0f}",
                    f"{arm.proxied_rps / arm.direct_rps:.2f}", "report",
                )  # fmt: skip
            table.add_row(
                "requests per second, 2 workers / 1 worker",
                f"{rates[2].proxied_rps / rates[1].proxied_rps:.2f}x", "", "",
                f"report ({os.cpu_count()} cores shared by engine, proxy and clients)",
            )  # fmt: skip
        if modes & {"closed-loop", "harness-load"}:
            load = InstantLoad(env, eport, engine.pid, args.clients, "instant")
            with proxy_process(env, eport, args.workers) as (proxy, load.pport):
                load.warm()
                if "closed-loop" in modes:
                    add_rows(table, "closed loop", load.measure(proxy.pid, args.requests, args.rounds))
                if "harness-load" in modes:
                    arm = load.measure(
                        proxy.pid,
                        args.think_requests,
                        args.rounds,
                        think_s=args.think_ms / 1e3,
                        jitter=args.jitter,
                    )
                    add_rows(table, f"harness load ({args.think_ms:.0f} ms +-{args.jitter:.0%} think)", arm)
    finally:
        engine.terminate()
        engine.wait(10)


def bench_incremental() -> tuple[float, float, int]:
    from gyre_proxy.chat import ChatRequest, Message, Role, TextBlock, ToolResultBlock, ToolUseBlock
    from gyre_proxy.engines import qwen_tokenizer
    from gyre_proxy.harness import GenericHarness
    from gyre_proxy.ingest import Ingestor, Qwen3Template, encode_request
    from gyre_proxy.ingest.tracegen import WORDS
    from gyre_store import InMemoryEventLog
    from gyre_store.catalog import CallFinish
    from gyre_store.trees import ExecutionContext, TrajectoryRecorder

    rng = np.random.default_rng(0)
    words = np.array(WORDS)
    template = Qwen3Template(qwen_tokenizer())
    ing = Ingestor(TrajectoryRecorder(InMemoryEventLog()), template, GenericHarness())
    history: list[Message] = [Message(Role.USER, (TextBlock("build it"),))]
    n = 0
    while True:
        text = " ".join(words[rng.integers(0, len(words), 700)])
        use = ToolUseBlock(f"t{n}", "Bash", json.dumps({"command": f"step {n}"}))
        answer = Message(Role.ASSISTANT, (TextBlock("next"), use))
        request = ChatRequest(system="sys", messages=tuple(history))
        prepared = ing.prepare("ex", "r", request)
        out = template.render_output(answer)
        ing.record(prepared, request_id=f"r{n}", output_ids=np.array(out.ids, np.int32),
                   output_logprobs=np.full(len(out), -0.1, np.float32), assistant=answer,
                   finish=CallFinish.STOP)  # fmt: skip
        history += [answer, Message(Role.USER, (ToolResultBlock(use.id, text),))]
        n += 1
        if prepared.encoded.input_len > 100_000:
            break
    request = ChatRequest(system="sys", messages=tuple(history))
    ctx = ing.recorder.context("ex")
    reps = 5
    began = time.perf_counter()
    for _ in range(reps):
        inc = encode_request(ctx, template, request)
    incremental = (time.perf_counter() - began) / reps
    began = time.perf_counter()
    for _ in range(reps):
        whole = encode_request(ExecutionContext("fresh"), template, request)
    full = (time.perf_counter() - began) / reps
    # The two differ by design: the incremental input reuses the sampled answers (with the
    # empty think block the generation prompt carried), the whole one re-renders them.
    assert inc.tokenized * 20 < whole.tokenized and whole.tokenized > 95_000
    return incremental, full, whole.input_len


MODES = ("streams", "workers", "encode", "closed-loop", "harness-load")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--modes", default="streams,workers,encode", help=f"comma-separated: {', '.join(MODES)}"
    )
    parser.add_argument("--clients", type=int, default=128, help="concurrent executions")
    parser.add_argument("--histories", default="1000,10000,100000", help="history sizes in tokens (streams)")
    parser.add_argument("--decode-ms", type=float, default=50.0, help="the engine's decode step (streams)")
    parser.add_argument("--answer-tokens", default="200-400", help="answer length range (streams)")
    parser.add_argument(
        "--duration", type=float, default=30.0, help="seconds counted per arm, over all its windows (streams)"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="windows per arm, interleaved direct, proxied, direct, proxied, ... (streams; the "
        "short-answer modes split their requests likewise)",
    )
    parser.add_argument("--workers", type=int, default=1, help="gyre proxy serve --workers (streams, legacy)")
    parser.add_argument("--requests", type=int, default=4, help="per client (workers, closed loop)")
    parser.add_argument("--think-ms", type=float, default=500.0, help="pause between requests (harness load)")
    parser.add_argument("--jitter", type=float, default=0.5, help="pause varies by +- this fraction")
    parser.add_argument("--think-requests", type=int, default=6, help="per client (harness load)")
    parser.add_argument(
        "--pg", default=os.environ.get("GYRE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
    )
    parser.add_argument("--serve-instant-engine", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve-paced-engine", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_instant_engine:
        instant_engine(args.serve_instant_engine)
        return 0
    if args.serve_paced_engine:
        paced_engine(args.serve_paced_engine, args.decode_ms, int(args.answer_tokens.split("-")[1]))
        return 0
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: each arm needs at least one window")
    modes = {m.strip() for m in args.modes.split(",") if m.strip()}
    if unknown := modes - set(MODES):
        parser.error(f"unknown modes {sorted(unknown)}; choose from {', '.join(MODES)}")

    table = Table(title=f"proxy benchmarks (one run; engine, proxy and clients share {os.cpu_count()} cores)")
    for c in ("figure", "proxied", "direct / baseline", "added or ratio", "target"):
        table.add_column(c)
    summary: list[str] = []
    if modes - {"encode"}:
        with scratch_database(args.pg, "gyre_bench_proxy") as url:
            env = {**os.environ, "GYRE_DATABASE_URL": url, "PYTHONPATH": str(ROOT)}
            if "streams" in modes:
                console.print(
                    f"streams: {args.clients} executions, answers of {args.answer_tokens} tokens streamed "
                    f"a token per chunk on a {args.decode_ms:g} ms decode step "
                    f"({1e3 / args.decode_ms:.0f} tokens/s per stream), {args.duration:g} s counted per arm "
                    f"in {args.rounds} windows of {args.duration / args.rounds:g} s, the arms alternating"
                )
                with Progress(console=console, transient=True) as progress:
                    summary += run_streams(args, env, table, progress)
            if modes & {"workers", "closed-loop", "harness-load"}:
                with console.status("short-answer modes"):
                    run_instant(args, env, table, modes)
    if "encode" in modes:
        inc, full, n_tokens = bench_incremental()
        table.add_row(
            f"encode a {n_tokens:,}-token history + 1 tool result",
            f"{inc * 1e3:.2f} ms incremental",
            f"{full * 1e3:.1f} ms whole",
            f"{full / inc:.0f}x faster",
            f">= 20x: {'MET' if full / inc >= 20 else 'MISSED'}",
        )
    console.print(table)
    for line in summary:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
