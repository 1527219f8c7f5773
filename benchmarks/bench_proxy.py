"""Proxy benchmarks, each figure beside a baseline measured in the same run.

    .venv/bin/python benchmarks/bench_proxy.py [--clients 128] [--requests 4] [--pg URL]

1. 128 concurrent streaming clients against an engine that answers instantly: the latency
   the proxy adds per request (proxied minus direct-to-engine, p50 and p99), requests per
   second, and the CPU time the proxy process spends per request (beside the engine's per
   direct request). The engine, the proxy (``gyre proxy serve``) and the clients run as
   three processes on this machine; in this closed loop the clients' own CPU counts too,
   so the added latency is roughly clients x added CPU per request / cores.
2. Incremental encoding of a 100,000-token history that grew by one tool result, against
   encoding the whole history.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import numpy as np
import psycopg
from psycopg import sql
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
console = Console()


def instant_engine(port: int) -> None:
    """An SGLang-API engine that answers every /generate at once with 'OK.' and <|im_end|>."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    from gyre_proxy.text_tokenizer import qwen_tokenizer

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

    async def ok(request: Request) -> JSONResponse:
        return JSONResponse({"model_path": "instant", "weight_version": "0"})

    app = Starlette(
        routes=[
            Route("/generate", generate, methods=["POST"]),
            Route("/health", ok),
            Route("/model_info", ok),
        ]
    )
    # Keep idle connections longer than the clients do (as the proxy does), so a request is
    # never sent on a connection the server is just closing.
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", timeout_keep_alive=75)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (Linux /proc; NaN elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_for(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} did not come up")


async def drive(clients: int, requests: int, one: object) -> list[float]:
    latencies: list[float] = []
    limits = httpx.Limits(max_connections=clients + 8, max_keepalive_connections=clients + 8)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:

        async def client(i: int) -> None:
            for r in range(requests):
                t = time.perf_counter()
                await one(http, i, r)  # type: ignore[operator]
                latencies.append(time.perf_counter() - t)

        await asyncio.gather(*(client(i) for i in range(clients)))
    return latencies


def bench_incremental() -> tuple[float, float, int]:
    from gyre_proxy.chat_template import Qwen3Template
    from gyre_proxy.harness import GenericHarness
    from gyre_proxy.ingest import Ingestor
    from gyre_proxy.messages import ChatRequest, Message, Role, TextBlock, ToolResultBlock, ToolUseBlock
    from gyre_proxy.text_tokenizer import qwen_tokenizer
    from gyre_proxy.tracegen import WORDS
    from gyre_store import InMemoryEventLog
    from gyre_store.recorder import ExecutionContext, TrajectoryRecorder

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
                   output_logprobs=np.full(len(out), -0.1, np.float32), assistant=answer, finish=_stop())  # fmt: skip
        history += [answer, Message(Role.USER, (ToolResultBlock(use.id, text),))]
        n += 1
        if prepared.encoded.input_len > 100_000:
            break
    request = ChatRequest(system="sys", messages=tuple(history))
    from gyre_proxy.incremental import encode_request

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


def _stop():  # type: ignore[no-untyped-def]
    from gyre_store.tito import CallFinish

    return CallFinish.STOP


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=128)
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument(
        "--pg", default=os.environ.get("GYRE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
    )
    parser.add_argument("--serve-instant-engine", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_instant_engine:
        instant_engine(args.serve_instant_engine)
        return 0

    table = Table(title="proxy benchmarks (one run, this machine: engine, proxy and clients share 2 cores)")
    for c in ("figure", "proxied", "direct / baseline", "added or ratio", "target"):
        table.add_column(c)

    name = f"gyre_bench_proxy_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.pg, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    db = args.pg.rsplit("/", 1)[0] + "/" + name
    eport, pport = free_port(), free_port()
    env = {**os.environ, "GYRE_DATABASE_URL": db, "PYTHONPATH": str(ROOT)}
    engine = subprocess.Popen([sys.executable, __file__, "--serve-instant-engine", str(eport)], env=env)
    proxy = None
    try:
        wait_for(f"http://127.0.0.1:{eport}/health")
        subprocess.run(
            [sys.executable, "-m", "tools.cli", "db", "upgrade"],
            env=env,
            check=True,
            cwd=ROOT,
            capture_output=True,
        )
        proxy = subprocess.Popen(
            [sys.executable, "-m", "tools.cli", "proxy", "serve", "--engine", f"e0=http://127.0.0.1:{eport}", "--port", str(pport), "--harness", "generic"],
            env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        wait_for(f"http://127.0.0.1:{pport}/health")
        keys = []
        for i in range(args.clients):
            out = subprocess.run([sys.executable, "-m", "tools.cli", "executions", "new", "--json", "--run-id", "bench", "--execution-id", f"b{i}"],
                                 env=env, cwd=ROOT, capture_output=True, text=True, check=True) if i < 1 else None  # fmt: skip
            keys.append(json.loads(out.stdout)["api_key"] if out else None)
        # one key per client, issued through the library (a CLI process each would take minutes)
        from gyre_proxy.keys import issue_key
        from gyre_store import PostgresEventLog, StoreConfig

        with PostgresEventLog(StoreConfig(db)) as log:
            keys = [keys[0]] + [
                issue_key(log, execution_id=f"b{i}", run_id="bench", harness="generic")
                for i in range(1, args.clients)
            ]

        prompt_ids = list(range(1000, 1400))

        async def direct(http: httpx.AsyncClient, i: int, r: int) -> None:
            async with http.stream(
                "POST",
                f"http://127.0.0.1:{eport}/generate",
                json={
                    "input_ids": prompt_ids,
                    "sampling_params": {"max_new_tokens": 16},
                    "return_logprob": True,
                    "stream": True,
                },
            ) as resp:
                async for _ in resp.aiter_lines():
                    pass

        histories: dict[int, list[dict[str, object]]] = {}

        async def proxied(http: httpx.AsyncClient, i: int, r: int) -> None:
            msgs = histories.setdefault(i, [])
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
            async with http.stream(
                "POST",
                f"http://127.0.0.1:{pport}/v1/messages",
                json=body,
                headers={"x-api-key": keys[i], "anthropic-version": "2023-06-01"},
            ) as resp:
                async for _ in resp.aiter_lines():
                    pass
            msgs.append({"role": "assistant", "content": "OK."})

        asyncio.run(drive(8, 2, direct))  # warm both paths
        began, engine_cpu = time.perf_counter(), cpu_seconds(engine.pid)
        d = asyncio.run(drive(args.clients, args.requests, direct))
        direct_rps = len(d) / (time.perf_counter() - began)
        engine_ms = (cpu_seconds(engine.pid) - engine_cpu) / len(d) * 1e3
        began, proxy_cpu = time.perf_counter(), cpu_seconds(proxy.pid)
        p = asyncio.run(drive(args.clients, args.requests, proxied))
        proxied_rps = len(p) / (time.perf_counter() - began)
        proxy_ms = (cpu_seconds(proxy.pid) - proxy_cpu) / len(p) * 1e3
        q = lambda xs, f: float(np.quantile(np.array(xs), f)) * 1e3  # noqa: E731
        table.add_row(
            "latency p50 (ms)",
            f"{q(p, 0.5):.1f}",
            f"{q(d, 0.5):.1f}",
            f"+{q(p, 0.5) - q(d, 0.5):.1f} ms",
            "<= +3 ms",
        )
        table.add_row(
            "latency p99 (ms)",
            f"{q(p, 0.99):.1f}",
            f"{q(d, 0.99):.1f}",
            f"+{q(p, 0.99) - q(d, 0.99):.1f} ms",
            "<= +15 ms",
        )
        table.add_row(
            "requests per second",
            f"{proxied_rps:.0f}",
            f"{direct_rps:.0f}",
            f"{proxied_rps / direct_rps:.2f}",
            "report",
        )
        table.add_row(
            "CPU per request (ms)",
            f"{proxy_ms:.2f} proxy",
            f"{engine_ms:.2f} engine",
            f"{proxy_ms / engine_ms:.1f}x",
            "report",
        )
    finally:
        for proc in (proxy, engine):
            if proc is not None:
                proc.terminate()
                proc.wait(10)
        with psycopg.connect(args.pg, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    inc, full, n_tokens = bench_incremental()
    table.add_row(
        f"encode a {n_tokens:,}-token history + 1 tool result",
        f"{inc * 1e3:.2f} ms incremental",
        f"{full * 1e3:.1f} ms whole",
        f"{full / inc:.0f}x faster",
        ">= 20x",
    )
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
